"""Per-token activation memory of one LoRA training step under FSDP1 / FSDP2 against one process, on CPU.

    python bench/measure_fsdp_activations.py                 # the default grid (about 2 min on 2 cores)
    python bench/measure_fsdp_activations.py --scaling       # + h, L, V doubled one at a time
    python bench/measure_fsdp_activations.py --setups single:reentrant,fsdp1:reentrant --layers 8 --detail 20
    python bench/measure_fsdp_activations.py --setups single:reentrant,fsdp1:reentrant --ablate

Results and the mechanism found: bench/results/fsdp-activations.md. Run it with the published runs' versions
(torch 2.4.1, transformers 4.45.2, peft 0.13.2) from a separate venv; FSDP2 on CPU needs torch >= 2.6:

    python3 -m venv /tmp/venv241 && /tmp/venv241/bin/pip install torch==2.4.1 transformers==4.45.2 \
        peft==0.13.2 accelerate==1.0.1
    /tmp/venv241/bin/python bench/measure_fsdp_activations.py --setups single:reentrant,fsdp1:reentrant --layers 8

Found: only FSDP1 with reentrant checkpointing and frozen decoder-layer units (LoRA) costs more, 2h(L-2)
bytes per token in the layers' backward: _register_post_backward_reshard_only_hook's multi-grad hook keeps
every finished layer's checkpointed input and its gradient alive until the end of backward.

Why: on published A100 runs (Mistral-7B LoRA, seq 4096, reentrant gradient checkpointing) the peak
allocated memory grows by ~844 kB per token per GPU under accelerate's FSDP1 against 671 kB on one GPU.
This script measures, on CPU, what tensors are alive at the step's peak in each setup and how their sum
grows with the tokens of a micro-batch.

Setups (each with peft LoRA r=16, dropout 0.1 on q,k,v,o_proj of a bf16 Mistral-shaped model, no mixed
precision, gradient checkpointing reentrant -- what transformers 4.45 defaults to, with
enable_input_require_grads as TRL 0.11 calls it -- or non-reentrant):
  single  one process, no FSDP;
  fsdp1   2 ranks, FullyShardedDataParallel as accelerate 1.0.1 builds it for a peft model under the HF
          Trainer: FULL_SHARD, peft.utils.other.fsdp_auto_wrap_policy (decoder layers + every LoRA
          Linear in its own unit), BACKWARD_PRE, use_orig_params=False, limit_all_gathers
          (sync_module_states off: FSDP1 refuses it on CPU; every rank builds the same seeded model);
  fsdp1-origparams  the same with use_orig_params=True (not in the default grid);
  fsdp2   2 ranks, fully_shard per decoder layer then the root, reshard_after_forward=True.
The ranks talk over gloo on a port picked free at run time.

Instrument: a TorchDispatchMode follows every storage an operator outputs with a weak reference (keyed by
the StorageImpl, which survives resizes) until it is freed, as bench/measure_activations.py does. FSDP
allocates and frees unsharded parameters by resizing storages in place (FSDP1 _alloc_storage/_free_storage,
FSDP2 alloc_storage/free_storage: UntypedStorage.resize_), which no operator dispatch sees; the tracker
therefore also wraps UntypedStorage.resize_ and books each resize as a free of the old size and an
allocation of the new one ("unsharded params"). Collective outputs are written into tensors allocated by
ordinary (dispatched) operators, so they are seen. Storages that exist before the step (parameters, flat
parameters' shards, FSDP's padded buffers at size 0) are ignored unless resized; the parameter gradients
alive after the step (.grad) are excluded afterwards. The peak is the maximum of live bytes between
operators over forward + backward (before any optimizer step), per rank. What this cannot see: the CUDA
caching allocator (block rounding, streams, record_stream, fragmentation), kernel workspaces, NCCL buffers.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Shape:
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 2
    ffn: int = 704
    layers: int = 4
    vocab: int = 32000
    seq: int = 256

    def label(self) -> str:
        return (f"h{self.hidden} a{self.heads}/kv{self.kv_heads} f{self.ffn} L{self.layers} "
                f"V{self.vocab} s{self.seq}")


# --- The tracker --------------------------------------------------------------------------------------

class Tracker:
    """Live storages between operators, by StorageImpl; alloc/free events with what allocated them."""

    def __init__(self, ignore: set[int]):
        import torch  # noqa: F401

        self.ignore = ignore
        self.entries: dict[int, list] = {}       # cdata -> [StorageWeakRef, nbytes, eid]
        self.meta: dict[int, tuple] = {}          # eid -> (segment, op, dtype, shape, where, kind)
        self.events: list[tuple[int, int, int]] = []   # (+1/-1/0 marker, eid or segment index, nbytes)
        self.segments: list[str] = []
        self.segment = "setup"
        self.op = ""
        self.resizes = 0

    def mark(self, segment: str):
        if segment != self.segment:
            self.segment = segment
            self.segments.append(segment)
            self.events.append((0, len(self.segments) - 1, 0))

    def sweep(self):
        dead = [c for c, e in self.entries.items() if e[0].expired()]
        for c in dead:
            _, nbytes, eid = self.entries.pop(c)
            self.events.append((-1, eid, nbytes))

    def _new(self, storage, cdata, dtype, shape, kind):
        from torch.multiprocessing.reductions import StorageWeakRef

        eid = len(self.meta)
        nbytes = storage.nbytes()
        self.entries[cdata] = [StorageWeakRef(storage), nbytes, eid]
        self.meta[eid] = (self.segment, self.op, dtype, shape, _where(), kind)
        self.events.append((1, eid, nbytes))

    def add(self, t):
        if t.device.type != "cpu":
            return
        storage = t.untyped_storage()
        cdata = storage._cdata
        if cdata in self.ignore or storage.nbytes() == 0:
            return
        old = self.entries.get(cdata)
        if old is not None:
            if not old[0].expired() and old[1] == storage.nbytes():
                return
            self.entries.pop(cdata)
            self.events.append((-1, old[2], old[1]))
        self._new(storage, cdata, str(t.dtype).removeprefix("torch."), tuple(t.shape), "tensor")

    def resized(self, storage):
        """Called after UntypedStorage.resize_: the old size is freed, the new one allocated."""
        cdata = storage._cdata
        self.resizes += 1
        old = self.entries.pop(cdata, None)
        if old is not None:
            self.events.append((-1, old[2], old[1]))
        if storage.nbytes() > 0:
            self._new(storage, cdata, "bytes", (storage.nbytes(),), "resize")


def _where() -> str:
    """The innermost Python frame outside torch's dispatch/autograd plumbing and this file: which hook or
    module asked for the tensor (FSDP's runtime, the checkpoint, peft, transformers, or the loss call)."""
    f = sys._getframe(3)
    for _ in range(60):
        if f is None:
            break
        fn = f.f_code.co_filename
        keep = ("distributed" in fn or "checkpoint.py" in fn or "peft" in fn or "transformers" in fn
                or "accelerate" in fn or ("torch" not in fn and "measure_fsdp" not in fn))
        if keep and "_python_dispatch" not in fn:
            parts = fn.split("site-packages/")[-1]
            return f"{parts}:{f.f_lineno} {f.f_code.co_name}"
        f = f.f_back
    return "?"


_ACTIVE: list[Tracker] = []


def _install_resize_hook():
    import torch

    if getattr(torch.UntypedStorage, "_fsdpmeas_patched", False):
        return
    orig = torch.UntypedStorage.resize_

    def resize_(self, size):
        out = orig(self, size)
        if _ACTIVE:
            _ACTIVE[-1].resized(self)
        return out

    torch.UntypedStorage.resize_ = resize_
    torch.UntypedStorage._fsdpmeas_patched = True


def _dispatch_mode(tracker: Tracker):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tracker.sweep()
            tracker.op = func.__name__
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    tracker.add(t)
            return out

    return Mode()


def _existing_storages(model) -> set[int]:
    """StorageImpls alive before the step: parameters, buffers and every tensor FSDP keeps on its state."""
    import torch

    seen: set[int] = set()

    def visit(obj, depth=0):
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu":
                seen.add(obj.untyped_storage()._cdata)
            if depth < 2:
                for name in ("_local_shard", "_full_param_padded", "_padded_unsharded_prim", "_mp_shard",
                             "_cpu_grad", "_saved_grad_shard", "_post_backward_hook_state"):
                    v = getattr(obj, name, None)
                    if isinstance(v, torch.Tensor):
                        visit(v, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                visit(v, depth + 1)

    for p in model.parameters():
        visit(p)
    for b in model.buffers():
        visit(b)
    for m in model.modules():
        for h in getattr(m, "_handles", []) or []:            # FSDP1 FlatParamHandle
            visit(h.flat_param)
        handle = getattr(m, "_handle", None)
        if handle is not None and hasattr(handle, "flat_param"):
            visit(handle.flat_param)
        state = getattr(m, "_get_fsdp_state", None)           # FSDP2: every FSDPParam's tensors
        if callable(state):
            try:
                pg = state()._fsdp_param_group
            except Exception:  # noqa: BLE001 -- not an FSDP2 module
                pg = None
            for fp in getattr(pg, "fsdp_params", []) if pg else []:
                for name in ("_sharded_param_data", "sharded_param", "_unsharded_param", "all_gather_outputs"):
                    visit(getattr(fp, name, None))
    return seen


# --- Model and setups ---------------------------------------------------------------------------------

def build_model(shape: Shape, gc: str):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, MistralConfig

    torch.manual_seed(0)
    config = MistralConfig(hidden_size=shape.hidden, num_attention_heads=shape.heads,
                           num_key_value_heads=shape.kv_heads, intermediate_size=shape.ffn,
                           num_hidden_layers=shape.layers, vocab_size=shape.vocab,
                           max_position_embeddings=max(shape.seq, 128), tie_word_embeddings=False)
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    except TypeError:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    model.train()
    lora = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")
    # TRL 0.11 SFTTrainer: get_peft_model, then enable_input_require_grads when checkpointing is reentrant;
    # the HF Trainer then calls gradient_checkpointing_enable(args.gradient_checkpointing_kwargs), which
    # transformers 4.45 turns into {"use_reentrant": True} when the kwargs are None.
    model = get_peft_model(model, lora)
    reentrant = gc == "reentrant"
    if reentrant:
        model.enable_input_require_grads()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return model


def wrap(model, mode: str):
    import torch

    if mode in ("fsdp1", "fsdp1-origparams"):
        from peft.utils.other import fsdp_auto_wrap_policy
        from torch.distributed.fsdp import (
            BackwardPrefetch,
            FullyShardedDataParallel,
            ShardingStrategy,
        )

        return FullyShardedDataParallel(
            model, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=fsdp_auto_wrap_policy(model),
            mixed_precision=None, sync_module_states=False, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
            forward_prefetch=False, use_orig_params=mode == "fsdp1-origparams", limit_all_gathers=True,
            device_id=torch.device("cpu"))
    if mode == "fsdp2":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        return model
    return model


def _decoder_layers(model):
    for m in model.modules():
        if type(m).__name__.endswith("DecoderLayer") and hasattr(m, "self_attn"):
            yield m


def _segment_hooks(model, tracker: Tracker, phase: dict):
    """Name the stretch of the step each event falls in: forward/recompute of layer i, the head, backward."""
    handles = []
    named = []
    n_layers = 0
    for name, m in model.named_modules():
        cls = type(m).__name__
        if cls.endswith("DecoderLayer") and hasattr(m, "self_attn"):
            named.append((m, f"layer{n_layers}"))
            n_layers += 1
        elif name.endswith("embed_tokens") and not any(n.endswith("embed_tokens") for _, n in named):
            named.append((m, "embed_tokens"))
        elif name.endswith("model.norm"):
            named.append((m, "final_norm"))
        elif name.endswith("lm_head") and cls != "FullyShardedDataParallel":
            named.append((m, "lm_head+loss"))
    seen = set()
    for m, label in named:
        if id(m) in seen:
            continue
        seen.add(id(m))

        def pre(mod, args, label=label):
            tracker.mark(f"{phase['name']}:{label}")

        def post(mod, args, out, label=label):
            if label != "lm_head+loss":
                tracker.mark(f"{phase['name']}:after-{label}")

        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    return handles


def step(model, shape: Shape, batch: int, rank: int, seed: int) -> dict:
    """One forward + backward of a packed micro-batch (input_ids, labels = input_ids, no attention mask, as
    TRL's ConstantLengthDataset feeds it); the tracker's peak and what is alive at it."""
    import torch

    g = torch.Generator().manual_seed(seed + rank)
    ids = torch.randint(0, shape.vocab, (batch, shape.seq), generator=g)
    model.zero_grad(set_to_none=True)
    tracker = Tracker(_existing_storages(model))
    phase = {"name": "fwd"}
    handles = _segment_hooks(model, tracker, phase)
    _ACTIVE.append(tracker)
    try:
        with _dispatch_mode(tracker):
            tracker.mark("fwd:start")
            out = model(input_ids=ids, labels=ids)
            loss = out["loss"] if isinstance(out, dict) else out[0]
            del out                      # the HF Trainer's compute_loss keeps only the loss
            phase["name"] = "bwd"
            tracker.mark("bwd:start")
            loss.backward()
            del loss
            tracker.sweep()
            tracker.mark("end")
    finally:
        _ACTIVE.pop()
        for h in handles:
            h.remove()
    grads = set()
    for p in model.parameters():
        if p.grad is not None:
            grads.add(p.grad.untyped_storage()._cdata)
    excluded = {e[2] for c, e in tracker.entries.items() if c in grads}
    return analyse(tracker, excluded, batch * shape.seq)


def analyse(tracker: Tracker, excluded: set[int], tokens: int) -> dict:
    """Peak of all tracked bytes and of the bytes that are not unsharded parameters; per-segment maxima;
    the live set at the peak grouped by who allocated it."""
    live = acts = 0
    peak = acts_peak = 0
    acts_peak_at = 0
    seg = "setup"
    seg_max: dict[str, int] = {}
    seg_max_at: dict[str, int] = {}
    for i, (kind, eid, nbytes) in enumerate(tracker.events):
        if kind == 0:
            seg = tracker.segments[eid]
            continue
        if eid in excluded:
            continue
        live += kind * nbytes
        if tracker.meta[eid][5] != "resize":
            acts += kind * nbytes
        peak = max(peak, live)
        if acts > acts_peak:
            acts_peak, acts_peak_at = acts, i
        if acts > seg_max.get(seg, -1):
            seg_max[seg], seg_max_at[seg] = acts, i

    def live_set(upto: int):
        alive: dict[int, int] = {}
        seg_at = "setup"
        for kind, eid, nbytes in tracker.events[:upto + 1]:
            if kind == 0:
                seg_at = tracker.segments[eid]
            elif eid not in excluded:
                if kind == 1:
                    alive[eid] = nbytes
                else:
                    alive.pop(eid, None)
        groups: dict[str, int] = {}
        for eid, nbytes in alive.items():
            segment, op, dtype, shp, where, kind = tracker.meta[eid]
            what = "unsharded params (storage resize)" if kind == "resize" else f"{op} | {dtype}{list(shp)}"
            key = f"{segment} | {what} | {where}"
            groups[key] = groups.get(key, 0) + nbytes
        return seg_at, sorted(groups.items(), key=lambda kv: -kv[1])

    seg_at, groups = live_set(acts_peak_at)
    explain = {k: live_set(seg_max_at[k])[1][:40] for k in os.environ.get("FSDPMEAS_EXPLAIN", "").split(",")
               if k in seg_max_at}
    return {"explain": explain, "tokens": tokens, "peak": peak, "acts_peak": acts_peak, "acts_peak_segment": seg_at,
            "acts_peak_live": groups[:60], "segment_max": seg_max, "resizes": tracker.resizes}


# --- Ranks --------------------------------------------------------------------------------------------

def _worker(rank: int, world: int, port: int, mode: str, gc: str, shape_d: dict, mbs: list[int], out_dir: str):
    import torch

    torch.set_num_threads(1)
    _install_resize_hook()
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    shape = Shape(**shape_d)
    if os.environ.get("FSDPMEAS_ABLATE") == "1":
        from torch.distributed.fsdp import _runtime_utils
        _runtime_utils._register_post_backward_reshard_only_hook = lambda *a, **k: None
    model = wrap(build_model(shape, gc), mode)
    step(model, shape, mbs[0], rank, seed=100)          # warm-up: FSDP's lazy init, first-use buffers
    results = [step(model, shape, b, rank, seed=b) for b in mbs]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_setup(mode: str, gc: str, shape: Shape, mbs: list[int]) -> list[list[dict]]:
    """[rank][micro-batch] results of one setup, each rank in its own process."""
    import torch.multiprocessing as mp

    world = 1 if mode == "single" else 2
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(world, _free_port(), mode, gc, asdict(shape), mbs, d), nprocs=world, join=True)
        out = []
        for r in range(world):
            with open(os.path.join(d, f"rank{r}.json")) as f:
                out.append(json.load(f))
    return out


def slope(results: list[dict], key: str) -> float:
    a, b = results[0], results[-1]
    return (b[key] - a[key]) / (b["tokens"] - a["tokens"])


def segment_slopes(results: list[dict]) -> dict[str, float]:
    """Bytes per token of the maximum live (non-parameter) bytes within each named stretch of the step."""
    a, b = results[0], results[-1]
    dt = b["tokens"] - a["tokens"]
    return {k: (b["segment_max"][k] - a["segment_max"][k]) / dt for k in b["segment_max"] if k in a["segment_max"]}


BRANCHES = {
    # where the step's peak can sit; each branch's maximum grows linearly with the tokens
    "loss": ("fwd:final_norm", "fwd:lm_head+loss", "bwd:start"),
    "layers-bwd": ("bwd:layer", "bwd:after-layer"),
}


def branch_slopes(results: list[dict]) -> dict[str, float]:
    """Bytes per token of the maximum live bytes in the loss stretch and in the layers' backward."""
    a, b = results[0], results[-1]
    out = {}
    for name, prefixes in BRANCHES.items():
        def top(r, prefixes=prefixes):
            return max((v for k, v in r["segment_max"].items() if k.startswith(prefixes)), default=0)
        out[name] = (top(b) - top(a)) / (b["tokens"] - a["tokens"])
    return out


MISTRAL_RATIOS = Shape(hidden=512, heads=4, kv_heads=1, ffn=1792, layers=8, vocab=2000)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--setups", default="single:reentrant,fsdp1:reentrant,fsdp2:reentrant,"
                                       "single:nonreentrant,fsdp1:nonreentrant,fsdp2:nonreentrant")
    p.add_argument("--mbs", default="1,2")
    p.add_argument("--scaling", action="store_true", help="also h, L, V doubled one at a time")
    p.add_argument("--json", help="write all results here")
    for f in ("hidden", "heads", "kv_heads", "ffn", "layers", "vocab", "seq"):
        p.add_argument(f"--{f.replace('_', '-')}", type=int, help=f"base shape's {f}")
    p.add_argument("--detail", type=int, default=0, help="rows of rank 0's live set at the peak to print")
    p.add_argument("--ablate", action="store_true",
                   help="FSDP1 without _register_post_backward_reshard_only_hook (proves the mechanism; "
                        "frozen units are then not resharded after backward)")
    args = p.parse_args(argv)
    mbs = [int(x) for x in args.mbs.split(",")]
    setups = [tuple(s.split(":")) for s in args.setups.split(",")]
    given = {f: getattr(args, f) for f in Shape.__dataclass_fields__ if getattr(args, f) is not None}
    # Default: the brief's small shape (the loss stretch holds the peak: 12V dominates) and a shape with
    # Mistral-7B's ratios (f = 3.5h, kv = h/4, head_dim 128) and a small vocabulary, where the layers'
    # backward holds the peak as it does for FSDP1 on Mistral-7B.
    shapes = [replace(Shape(), **given)] if given else [Shape(), MISTRAL_RATIOS]
    if args.scaling:
        base = shapes[-1]
        shapes += [replace(base, hidden=2 * base.hidden, heads=2 * base.heads, kv_heads=2 * base.kv_heads,
                           ffn=2 * base.ffn),
                   replace(base, layers=2 * base.layers), replace(base, vocab=2 * base.vocab)]
    if args.ablate:
        os.environ["FSDPMEAS_ABLATE"] = "1"
    import peft
    import torch
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}"
          f"{'  [ABLATED: no reshard-only hook]' if args.ablate else ''}")
    all_results = []
    for shape in shapes:
        print(f"\n== {shape.label()}, micro-batches {mbs} (tokens {[b * shape.seq for b in mbs]}); "
              f"bytes per token per rank")
        print(f"{'setup':20s} {'rank':>4s} {'peak slope':>11s} {'- single':>9s} {'/h':>7s}  "
              f"{'loss br.':>9s} {'layers-bwd':>10s}  peak in")
        base_slope = {}
        for mode, gc in setups:
            t0 = time.time()
            try:
                res = run_setup(mode, gc, shape, mbs)
            except Exception as e:  # noqa: BLE001 -- e.g. FSDP2 on CPU needs torch >= 2.6
                lines = [x for x in str(e).splitlines() if "Error: " in x] or str(e).strip().splitlines()
                print(f"{mode + ':' + gc:20s} failed on this torch: {lines[-1].strip()[:140]}")
                continue
            for r, rr in enumerate(res):
                s_act = slope(rr, "acts_peak")
                if mode == "single":
                    base_slope[gc] = s_act
                excess = s_act - base_slope[gc] if gc in base_slope else float("nan")
                br = branch_slopes(rr)
                print(f"{mode + ':' + gc:20s} {r:4d} {s_act:11.1f} {excess:+9.1f} {excess / shape.hidden:+7.2f}  "
                      f"{br['loss']:9.1f} {br['layers-bwd']:10.1f}  {rr[-1]['acts_peak_segment']}"
                      f"{f'  ({time.time() - t0:.0f} s)' if r == len(res) - 1 else ''}")
            all_results.append({"shape": asdict(shape), "mode": mode, "gc": gc, "ablate": args.ablate,
                                "ranks": res})
            if args.detail:
                last = res[0][-1]
                print(f"   rank 0's live set at the peak, mb{mbs[-1]}, bytes per token (top {args.detail}):")
                for k, v in last["acts_peak_live"][:args.detail]:
                    print(f"     {v / last['tokens']:>10.1f}  {k}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
