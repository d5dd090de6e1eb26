"""One rung at given inputs: its speed, whether it fits, and the searches over the memory model (the largest
micro-batch, the longest sequence). Split from plan.py, which re-exports every name.
"""

from __future__ import annotations

from dataclasses import replace

from wizard.planning import speed as speed_mod
from wizard.planning.evaluate import _estimate, _Inputs, CodeOptions, NO_CODE
from wizard.planning.plan_types import _scaled_speed
from wizard.planning.rungs import RungSpec
from wizard.sizing import memory as mem


def _layout(spec: RungSpec, x: _Inputs) -> speed_mod.Layout:
    return speed_mod.Layout(backend=spec.backend, zero_stage=spec.zero_stage,
                            offload_optimizer=spec.offload_optimizer, offload_param=spec.offload_param,
                            fsdp_reshard=spec.fsdp_reshard, per_machine=x.per_machine, machines=x.machines,
                            replicate=spec.replicate)


def _speed(spec: RungSpec, x: _Inputs, batch: int, grad_accum: int, gc: bool,
           code: CodeOptions = NO_CODE) -> speed_mod.Speed:
    a = x.adapters
    head_dim = x.stack.head_dim or x.hidden // max(x.heads, 1)
    kv_heads = x.kv_heads
    if spec.sp_size > 1:
        # Ulysses replicates the key/value heads up to sp when there are fewer (sequence.ulysses_kv_heads_per_rank)
        kv_heads = max(kv_heads, spec.sp_size)
    work = speed_mod.Workload(matmul_params=x.active_params, params=x.params, layers=x.layers, hidden=x.hidden,
                              seq=x.seq, micro_batch=batch, grad_accum=grad_accum, precision=x.precision,
                              flash=x.flash, gradient_checkpointing=gc,
                              trainable_params=None if a is None else a.trainable_params,
                              dequant_params=a.quantized_params if a is not None and a.method == "qlora" else 0,
                              weight_bytes=a.frozen_bytes(mem.working_bytes(x.precision)) +
                              a.trainable_params * mem.working_bytes(x.precision) if a is not None else None,
                              adapter_modules=0 if a is None else a.adapted_modules,
                              adapter_io_elements=0 if a is None else a.trainable_params // max(a.rank, 1),
                              seq_shards=spec.seq_shards, kv_width=kv_heads * head_dim,
                              ulysses=spec.sp_size > 1, q_width=x.heads * head_dim,
                              mlp_params=_mlp_params(x) if code.tiled_mlp else 0, tiled_mlp=code.tiled_mlp,
                              checkpoint_offload=code.checkpoint_offload and gc)
    speed = speed_mod.estimate(x.machine, work, _layout(spec, x))
    ratios = x.ratios(spec.key)
    return _scaled_speed(speed, ratios.speed) if ratios is not None and ratios.speed else speed


def _mlp_params(x: _Inputs) -> int:
    """The matmul parameters of the MLPs a token runs through (gated: three h x f matrices a layer, a plain MLP
    two; MoE: the routed experts' and the shared ones)."""
    matrices = 3 if x.profile.gated_mlp else 2
    st = x.stack
    ffn = (st.expert_ffn or st.ffn) * max(st.experts_per_token, 1) + st.shared_ffn if st.experts_per_token else st.ffn
    return matrices * x.hidden * ffn * x.layers


def _fits_gpu(spec: RungSpec, x: _Inputs, batch: int, gc: bool, code: CodeOptions = NO_CODE) -> bool:
    est = _estimate(spec, replace(x, batch=batch), gc, code)
    if code.checkpoint_offload and x.ram is not None and est.cpu > x.ram:
        return False            # the offloaded checkpoints grow with the batch and the sequence: host RAM counts
    return est.per_gpu <= x.usable and est.load <= x.usable


# Above this a micro-batch is not a planning question any more; the search stops there.
MAX_MICRO_BATCH = 1 << 20


def largest_micro_batch(spec: RungSpec, x: _Inputs, gc: bool, code: CodeOptions = NO_CODE) -> int:
    """The largest micro-batch whose per-GPU estimate fits (0 when even 1 does not), by doubling then
    bisection over the memory model: about 2 log2(answer) estimates, never a linear scan."""
    if not _fits_gpu(spec, x, 1, gc, code):
        return 0
    low, high = 1, 2
    while high <= MAX_MICRO_BATCH and _fits_gpu(spec, x, high, gc, code):
        low, high = high, high * 2
    if high > MAX_MICRO_BATCH:
        return MAX_MICRO_BATCH
    while high - low > 1:                     # low fits, high does not
        mid = (low + high) // 2
        if _fits_gpu(spec, x, mid, gc, code):
            low = mid
        else:
            high = mid
    return low


# Above this a sequence length is not a planning question any more; the search stops there (2^27: 134M tokens, nine
# times ALST's 15M on 32 GPUs).
MAX_SEQ_LEN = 1 << 27


def _fits_seq(spec: RungSpec, x: _Inputs, seq: int, gc: bool, code: CodeOptions = NO_CODE) -> bool:
    """Whether `seq` fits the GPU and the host: a rung whose host RAM does not hold it (70B's CPU optimizer on a
    machine with too little RAM) takes no sequence at all."""
    x = replace(x, seq=seq)
    if x.ram is not None and not x.cpu and _estimate(spec, x, gc, code).cpu > x.ram:
        return False
    return _fits_gpu(spec, x, x.batch, gc, code)


def seq_unit(spec: RungSpec) -> int:
    """What a sequence length must be a multiple of on this rung: 2 x cp (torch's causal load balancer cuts each
    sequence into 2 x cp chunks), sp (UlyssesSPDataLoaderAdapter splits it into sp equal shards), else 1."""
    if spec.cp_size > 1:
        return 2 * spec.cp_size
    return max(spec.sp_size, 1)


def longest_seq_len(spec: RungSpec, x: _Inputs, gc: bool, code: CodeOptions = NO_CODE) -> int:
    """The longest --seq-len whose per-GPU estimate fits at this micro-batch (0 when even one step of the length's
    unit does not), by the same doubling and bisection as largest_micro_batch, in steps of seq_unit."""
    unit = seq_unit(spec)
    if not _fits_seq(spec, x, unit, gc, code):
        return 0
    low, high = 1, 2                          # in units
    while high * unit <= MAX_SEQ_LEN and _fits_seq(spec, x, high * unit, gc, code):
        low, high = high, high * 2
    if high * unit > MAX_SEQ_LEN:
        return MAX_SEQ_LEN // unit * unit
    while high - low > 1:
        mid = (low + high) // 2
        if _fits_seq(spec, x, mid * unit, gc, code):
            low = mid
        else:
            high = mid
    return low * unit
