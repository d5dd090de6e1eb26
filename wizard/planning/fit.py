"""One rung at given inputs: its speed, whether it fits, and the searches over the memory model (the largest
micro-batch, the longest sequence). Split from plan.py, which re-exports every name.
"""

from __future__ import annotations

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


def gpu_slack(spec: RungSpec, x: _Inputs, batch: int, gc: bool, code: CodeOptions = NO_CODE) -> int:
    """Bytes left at this micro-batch by the tightest limit: the usable GPU memory (during the step and while the
    model loads) and, for checkpoints offloaded to the host, its RAM. It fits when this is >= 0."""
    est = _estimate(spec, x.but(batch=batch) if batch != x.batch else x, gc, code)
    # the offloaded checkpoints grow with the batch and the sequence: host RAM counts
    return _slack(x, est, host=code.checkpoint_offload)


def _slack(x: _Inputs, est, host: bool) -> int:
    slack = min(x.usable - est.per_gpu, x.usable - est.load)
    if host and x.ram is not None:
        slack = min(slack, x.ram - est.cpu)
    return slack


def _fits_gpu(spec: RungSpec, x: _Inputs, batch: int, gc: bool, code: CodeOptions = NO_CODE) -> bool:
    return gpu_slack(spec, x, batch, gc, code) >= 0


def largest_fitting(slack, top: int) -> int:
    """The largest k in 1..top with slack(k) >= 0, for a slack that never grows with k (0 when even 1 does not fit).

    The memory model is close to linear in the micro-batch and the sequence (quadratic where eager attention keeps
    its scores), so the slack's own values say where it crosses zero: the curve through the last three points lands
    there or next to it, and the neighbour on the other side closes the bracket. A step that does not cut the bracket
    by a quarter is followed by a bisection, so a slack with no slope to follow (a cliff) still takes a logarithmic
    number: 4-8 estimates where doubling and bisection took 2 log2(answer), 30-50 for a million tokens, for every
    rung of every plan."""
    lo, s_lo = 1, slack(1)
    if s_lo < 0:
        return 0
    seen = [(lo, s_lo)]
    # Bracketing: extrapolate the line through the last two fitting points to its zero; double while there is no
    # slope yet (or the slack does not fall), and at least double after two extrapolations that fell short.
    short = 0
    hi = s_hi = None
    while hi is None:
        if lo >= top:
            return top
        if len(seen) < 2 or seen[-2][1] <= s_lo:
            guess = 2 * lo
        else:
            k0, s0 = seen[-2]
            guess = lo + s_lo * (lo - k0) // (s0 - s_lo) + 1
            if short >= 2:
                guess = max(guess, 2 * lo)
        guess = min(max(guess, lo + 1), top)
        s = slack(guess)
        seen.append((guess, s))
        if s >= 0:
            lo, s_lo = guess, s
            short += 1
        else:
            hi, s_hi = guess, s
    # Closing: lo fits, hi does not.
    def probe(k: int) -> bool:
        nonlocal lo, s_lo, hi, s_hi
        s = slack(k)
        seen.append((k, s))
        if s >= 0:
            lo, s_lo = k, s
        else:
            hi, s_hi = k, s
        return s >= 0

    while hi - lo > 1:
        width = hi - lo
        guess = _zero_between(seen, lo, s_lo, hi, s_hi)
        if probe(guess) and guess + 1 < hi:
            probe(guess + 1)                  # the neighbour across the edge
        if hi - lo > 1 and 4 * (hi - lo) > 3 * width:
            probe((lo + hi) // 2)             # a step that did not cut a quarter: bisect once
    return lo


def _zero_between(seen: list[tuple[int, int]], lo: int, s_lo: int, hi: int, s_hi: int) -> int:
    """The last k in (lo, hi) before the slack's zero, by the parabola through lo, hi and the latest other point
    (exact for a slack linear or quadratic in k), else by the line through lo and hi."""
    third = next(((k, s) for k, s in reversed(seen) if k not in (lo, hi)), None)
    root = None
    if third is not None:
        # p(t) = s_lo + d1 t + d2 t (t - th), t = k - lo: Newton's form through (0, s_lo), (th, s_h), (tc, s_c)
        th, tc = hi - lo, third[0] - lo
        d1 = (s_hi - s_lo) / th
        d2 = ((third[1] - s_hi) / (tc - th) - d1) / tc
        a, b = d2, d1 - d2 * th
        if a == 0:
            root = -s_lo / b if b else None
        else:
            disc = b * b - 4 * a * s_lo
            if disc >= 0:
                inside = [t for t in ((-b - disc ** 0.5) / (2 * a), (-b + disc ** 0.5) / (2 * a)) if 0 <= t <= th]
                root = inside[0] if inside else None
    if root is None:
        root = s_lo * (hi - lo) / (s_lo - s_hi)
    return min(max(lo + int(root), lo + 1), hi - 1)


# Above this a micro-batch is not a planning question any more; the search stops there.
MAX_MICRO_BATCH = 1 << 20


def largest_micro_batch(spec: RungSpec, x: _Inputs, gc: bool, code: CodeOptions = NO_CODE) -> int:
    """The largest micro-batch whose per-GPU estimate fits (0 when even 1 does not), searched over the memory
    model by largest_fitting, never a linear scan."""
    return largest_fitting(lambda batch: gpu_slack(spec, x, batch, gc, code), MAX_MICRO_BATCH)


# Above this a sequence length is not a planning question any more; the search stops there (2^27: 134M tokens, nine
# times ALST's 15M on 32 GPUs).
MAX_SEQ_LEN = 1 << 27


def seq_slack(spec: RungSpec, x: _Inputs, seq: int, gc: bool, code: CodeOptions = NO_CODE) -> int:
    """gpu_slack at this sequence length, and the host's RAM for what the rung keeps there: a rung whose host RAM
    does not hold it (70B's CPU optimizer on a machine with too little RAM) takes no sequence at all."""
    x = x.but(seq=seq)
    return _slack(x, _estimate(spec, x, gc, code), host=not x.cpu)


def _fits_seq(spec: RungSpec, x: _Inputs, seq: int, gc: bool, code: CodeOptions = NO_CODE) -> bool:
    return seq_slack(spec, x, seq, gc, code) >= 0


def seq_unit(spec: RungSpec) -> int:
    """What a sequence length must be a multiple of on this rung: 2 x cp (torch's causal load balancer cuts each
    sequence into 2 x cp chunks), sp (UlyssesSPDataLoaderAdapter splits it into sp equal shards), else 1."""
    if spec.cp_size > 1:
        return 2 * spec.cp_size
    return max(spec.sp_size, 1)


def longest_seq_len(spec: RungSpec, x: _Inputs, gc: bool, code: CodeOptions = NO_CODE) -> int:
    """The longest --seq-len whose per-GPU estimate fits at this micro-batch (0 when even one step of the length's
    unit does not), by largest_fitting over whole units (seq_unit)."""
    unit = seq_unit(spec)
    return unit * largest_fitting(lambda k: seq_slack(spec, x, k * unit, gc, code), MAX_SEQ_LEN // unit)
