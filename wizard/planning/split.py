"""The rungs that split each sequence over several GPUs: FSDP2's context parallelism (ring attention) and DeepSpeed's
Ulysses sequence parallelism. Which of them a plan tries, a size the user asked for (honoured or refused with the
reason), and the longest sequence the machine takes over every rung the options allow.

Split from plan.py; the rung entries themselves are the table's (wizard.planning.rungs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from wizard import versions
from wizard.errors import InputError
from wizard.planning import rungs as rung_table
from wizard.planning.evaluate import _estimate, _evaluate, _Inputs, CodeOptions, CODE_STEPS, NO_CODE
from wizard.planning.fit import longest_seq_len
from wizard.planning.plan_types import Rung, StrategyOptions, TrainingOptions
from wizard.planning.reasons import rung_class
from wizard.planning.resolve import liger_problem
from wizard.planning.rungs import BY_KEY
from wizard.sizing import sequence as seqmem

Evaluated = list[tuple[Rung, Any]]


# --- What can split the sequence here ---------------------------------------------------------------------------

def _cp_problem(strategy: StrategyOptions, training: TrainingOptions, x: _Inputs) -> str | None:
    """Why context parallelism cannot run here (FSDP2 on GPUs, SDPA attention, the HF Trainer's causal-LM split), or
    None."""
    if x.cpu:
        return "they need GPUs"
    if strategy.fsdp_version != 2:
        return "they need FSDP2 (--fsdp-version 2)"
    if training.attention in ("flash", "eager") or not x.flash:
        return (f"they need SDPA attention (--attention sdpa or auto), and the attention here is "
                f"{training.attention if training.attention != 'auto' else 'eager or unfused'}")
    if x.task != "causal-lm":
        return f"the HF Trainer splits causal-LM batches only, and the task is {x.task}"
    if training.optimizer == "adamw-8bit":
        return "8-bit AdamW cannot step FSDP2's sharded parameters (ladder._steppable_by)"
    return None


def _sp_problem(training: TrainingOptions, x: _Inputs) -> str | None:
    """Why Ulysses cannot run here, or None: DeepSpeed on GPUs, a causal LM of attention layers (accelerate 1.16
    refuses recurrent layers, and an encoder-decoder's cross-attention is not wrapped), and an attention that needs no
    4D mask (UlyssesSPAttentionHF.register_with_transformers refuses eager: "requires a 4D attention_mask")."""
    if x.cpu:
        return "it needs GPUs"
    if x.task != "causal-lm":
        return f"the Trainer splits causal-LM batches only, and the task is {x.task}"
    if x.stack.ssm_state:
        return "the model's layers are recurrent (state-space), whose state does not cross the ranks"
    if x.stack.cross_attention_layers:
        return "the model is an encoder-decoder"
    if training.attention == "eager" or not x.flash:
        return (f"it needs SDPA or flash attention (DeepSpeed refuses eager's 4D mask), and the attention here is "
                f"{training.attention if training.attention != 'auto' else 'eager or unfused'}")
    return None


def ulysses_sizes(x: _Inputs) -> tuple[int, ...]:
    """The table's Ulysses sizes DeepSpeed allows for this model's heads (sequence.ulysses_sizes_allowed)."""
    allowed = seqmem.ulysses_sizes_allowed(x.heads, x.kv_heads)
    return tuple(sp for sp in rung_table.ULYSSES_SIZES if sp in allowed)


def _within_machine(spec: rung_table.RungSpec, x: _Inputs) -> bool:
    return spec.seq_shards <= x.per_machine and x.per_machine % spec.seq_shards == 0


def _sp_keys(strategy: StrategyOptions, training: TrainingOptions, x: _Inputs, size: int | None = None) -> list[str]:
    keys = rung_table.sequence_parallel_keys(strategy.backend, str(strategy.zero_stage), strategy.offload,
                                             training.method, ulysses_sizes(x), x.world, x.seq)
    out = [k for k in keys if size is None or BY_KEY[k].sp_size == size]
    # a group wider than a machine only where the machines' GPUs fill it (DeepSpeed's groups are consecutive ranks)
    return [k for k in out if _within_machine(BY_KEY[k], x) or BY_KEY[k].sp_size % x.per_machine == 0]


def transformers_version(hw) -> str | None:
    """The training machine's transformers: a probe's record of it (wizard probe --json, --hardware), else this
    machine's package metadata (imports nothing)."""
    libraries = getattr(hw, "libraries", None) or {}
    return libraries["transformers"] if "transformers" in libraries else versions.installed_version("transformers")


def ulysses_gradients_note(choice: Rung | None, hw) -> list[str]:
    """The note for a chosen Ulysses rung on ZeRO-1/2 where transformers scales its gradients by sp
    (sequence.ulysses_gradients_too_large)."""
    if choice is None or choice.sp_size <= 1:
        return []
    version = transformers_version(hw)
    if not seqmem.ulysses_gradients_too_large(choice.zero_stage, choice.sp_size, version):
        return []
    problem, fix = seqmem.ulysses_gradients_text(choice.zero_stage, choice.sp_size, version)
    return [f"Warning: {problem}. Fix: {fix}."]


# --- A size the user asked for ----------------------------------------------------------------------------------

def requested_keys(strategy: StrategyOptions, training: TrainingOptions, x: _Inputs) -> list[str] | None:
    """The ladder for a --parallelism-config-cp-size / -sp-size above 1: only the rungs of that size (a size the plan
    does not model is refused, exit 2, with the reason). None when no such size was given."""
    cp, sp = strategy.cp_size or 1, strategy.sp_size or 1
    if cp > 1 and sp > 1:
        raise InputError("parallelism-config-sp-size", f"{sp} beside --parallelism-config-cp-size {cp}: accelerate's "
                         "ParallelismConfig refuses both (context and sequence parallelism are mutually exclusive)",
                         "one of them, the other 1")
    if cp > 1:
        return [_requested_cp(cp, strategy, training, x)]
    if sp > 1:
        return _requested_sp(sp, strategy, training, x)
    return None


def _requested_cp(cp: int, strategy: StrategyOptions, training: TrainingOptions, x: _Inputs) -> str:
    flag = "parallelism-config-cp-size"
    sizes = [r.cp_size for r in rung_table.RUNGS if r.cp_size > 1]
    if strategy.backend not in ("auto", "fsdp"):
        raise InputError(flag, f"{cp}: context parallelism is FSDP2's, and --backend is {strategy.backend}",
                         "--backend fsdp or auto; for DeepSpeed, --parallelism-config-sp-size (Ulysses)")
    if strategy.offload not in ("auto", "none"):
        raise InputError(flag, f"{cp}: torch's context parallelism does not combine with --offload {strategy.offload}",
                         "--offload auto or none")
    problem = _cp_problem(strategy, training, x)
    if problem:
        raise InputError(flag, f"{cp}: context-parallel rungs cannot run here: {problem}", "1")
    if x.world % cp:
        raise InputError(flag, f"{cp} does not divide the {x.world} processes (accelerate's ParallelismConfig needs "
                         "replicate x shard x tp x cp = the processes)", f"a divisor of {x.world}")
    if cp not in sizes or cp > x.per_machine:
        allowed = [s for s in sizes if s <= x.per_machine]
        raise InputError(flag, f"{cp}: the plan models context parallelism over 2, 4 or 8 GPUs of one machine, and "
                         f"a machine here has {x.per_machine}", ", ".join(map(str, [1] + allowed)))
    if x.seq % (2 * cp):
        raise InputError(flag, f"{cp}: torch's causal load balancer cuts each sequence into 2 x cp = {2 * cp} equal "
                         f"chunks, and --seq-len {x.seq} is not a multiple of {2 * cp}",
                         f"a --seq-len that is a multiple of {2 * cp}, or another size")
    return f"fsdp-cp{cp}"


def _requested_sp(sp: int, strategy: StrategyOptions, training: TrainingOptions, x: _Inputs) -> list[str]:
    flag = "parallelism-config-sp-size"
    if strategy.backend not in ("auto", "deepspeed"):
        raise InputError(flag, f"{sp}: Ulysses sequence parallelism is DeepSpeed's, and --backend is "
                         f"{strategy.backend}", "--backend deepspeed or auto; for FSDP2, --parallelism-config-cp-size")
    problem = _sp_problem(training, x)
    if problem:
        raise InputError(flag, f"{sp}: Ulysses cannot run here: {problem}", "1")
    allowed = seqmem.ulysses_sizes_allowed(x.heads, x.kv_heads)
    if sp not in allowed:
        raise InputError(flag, f"{sp}: DeepSpeed's Ulysses needs the {x.heads} attention heads divisible by it and "
                         f"the {x.kv_heads} key/value heads divisible by it or dividing it",
                         ", ".join(str(s) for s in allowed if s <= x.world))
    if x.world % sp:
        raise InputError(flag, f"{sp} does not divide the {x.world} processes (DeepSpeed groups them into sequence-"
                         "parallel groups of that size)", f"a divisor of {x.world}")
    if sp not in rung_table.ULYSSES_SIZES:
        raise InputError(flag, f"{sp}: the plan models Ulysses over "
                         f"{', '.join(map(str, rung_table.ULYSSES_SIZES))} GPUs", "one of those, or 1")
    if x.seq % sp:
        raise InputError(flag, f"{sp}: DeepSpeed's data-loader adapter splits each sequence into {sp} equal shards, "
                         f"and --seq-len {x.seq} is not a multiple of {sp}", f"a --seq-len that is a multiple of {sp}")
    if not _within_machine(BY_KEY[f"zero2-sp{sp}"], x) and sp % x.per_machine:
        raise InputError(flag, f"{sp}: a group wider than a machine must take whole machines of {x.per_machine} "
                         "GPUs (DeepSpeed's groups are consecutive ranks)", f"a multiple of {x.per_machine}")
    keys = _sp_keys(strategy, training, x, sp)
    if not keys:
        raise InputError(flag, f"{sp}: no Ulysses rung matches --zero-stage {strategy.zero_stage} --offload "
                         f"{strategy.offload} (Ulysses runs on ZeRO-2 or 3, with the optimizer on the GPU or the CPU)",
                         "--zero-stage auto, 2 or 3 and --offload auto, none or cpu")
    return sorted(keys, key=lambda k: BY_KEY[k].offloads)


# --- Which split rungs the plan tries ---------------------------------------------------------------------------

def _fits_without_gc(rung: Rung, x: _Inputs) -> bool:
    if not rung.fits:
        return False
    if not rung.gradient_checkpointing:
        return True
    return _estimate(BY_KEY[rung.key], x, False).per_gpu <= x.usable      # GC was forced on (--gradient-checkpointing on)


def sequence_matters(evaluated: Evaluated, x: _Inputs) -> bool:
    """Whether what grows with the sequence is what costs memory: no rung of the ladder's cheapest class (without
    offload where the ladder has such rungs: --offload cpu leaves only offload rungs) fits without gradient
    checkpointing."""
    if not evaluated:
        return False
    cheapest = min(rung_class(r) for r, _ in evaluated)
    return not any(_fits_without_gc(r, x) for r, _ in evaluated if rung_class(r) == cheapest)


def states_fit(rung: Rung, x: _Inputs) -> bool:
    """Whether what does not grow with the sequence (model states, buffers, CUDA context) fits this rung's GPU."""
    b = rung.breakdown
    return sum(b.get(k, 0) for k in ("parameters", "gradients", "optimizer", "buffers", "context")) <= x.usable


def _no_extras(rung: Rung) -> bool:
    return not (rung.gradient_checkpointing or rung.checkpoint_offload or rung.tiled_mlp)


def _walk(family: list[str], x: _Inputs, gc_mode: str, below: int | None = None) -> Evaluated:
    """One family's sizes, smallest first, within a machine before across machines (those only where nothing within a
    machine fits), below `below` when given: each shown until the first that fits; past it, where that one needs
    gradient checkpointing, the first that fits without it (a larger split is never faster at the same settings: fewer
    tokens per GPU and more exchange; it is faster only where it saves the recomputation). A rung whose states alone
    do not fit is left out: splitting the sequence does not help it."""
    out: Evaluated = []
    inside = [k for k in family if _within_machine(BY_KEY[k], x)]
    across = [k for k in family if k not in inside]
    fitting = False
    for group in (inside, across):
        if group is across and fitting:
            break
        for key in group:
            if below is not None and BY_KEY[key].seq_shards >= below:
                return out
            rung, without_gc = _evaluate(BY_KEY[key], x, gc_mode)
            if not states_fit(rung, x):
                continue
            if fitting and not (rung.fits and _no_extras(rung)):
                continue                        # fits only as the smaller one does: nothing new to show
            out.append((rung, without_gc))
            if rung.fits and _no_extras(rung):
                return out
            fitting = fitting or rung.fits
    return out


def _smallest_plain_fit(walked: Evaluated) -> int | None:
    sizes = [r.seq_shards for r, _ in walked if r.fits and _no_extras(r)]
    return min(sizes) if sizes else None


def split_rungs(strategy: StrategyOptions, training: TrainingOptions, x: _Inputs, evaluated: Evaluated,
                notes: list[str]) -> Evaluated:
    """The context- and sequence-parallel rungs to add to the ladder (before its offload rungs): where the sequence
    is what costs memory (sequence_matters), where they can run, compact (_walk). Ulysses with optimizer offload only where nothing without offload fits. Says why none is tried where the
    sequence needs one and nothing without offload fits."""
    if (strategy.cp_size or 1) > 1 or (strategy.sp_size or 1) > 1:
        return []                               # the ladder is already the asked size's (requested_keys)
    if x.cpu or not sequence_matters(evaluated, x):
        return []
    gc_mode = training.gradient_checkpointing
    nothing_without_offload = not any(r.fits and not r.offloads for r, _ in evaluated)
    out: Evaluated = []
    why_not = []
    if strategy.cp_size != 1:
        cp_keys = rung_table.context_parallel_keys(strategy.backend, strategy.offload, training.method,
                                                   x.per_machine, x.seq)
        problem = _cp_problem(strategy, training, x) if cp_keys else None
        if problem:
            why_not.append(f"context parallelism: {problem}")
        elif cp_keys:
            out += _walk(cp_keys, x, gc_mode)
    if strategy.sp_size != 1 and strategy.backend in ("auto", "deepspeed") and x.world > 1:
        problem = _sp_problem(training, x)
        keys = [] if problem else _sp_keys(strategy, training, x)
        if problem:
            why_not.append(f"Ulysses sequence parallelism: {problem}")
        plain = [k for k in keys if not BY_KEY[k].offloads]
        zero2 = [k for k in plain if BY_KEY[k].zero_stage == 2]
        walked = _walk(zero2, x, gc_mode)
        # ZeRO-3 is never faster than ZeRO-2 at the same settings: only sizes below ZeRO-2's first plain fit
        walked += _walk([k for k in plain if BY_KEY[k].zero_stage == 3], x, gc_mode, _smallest_plain_fit(walked))
        out += walked
        if not any(r.fits for r, _ in out) and nothing_without_offload:
            offload = [k for k in keys if BY_KEY[k].offloads]
            walked = _walk([k for k in offload if BY_KEY[k].zero_stage == 2], x, gc_mode)
            walked += _walk([k for k in offload if BY_KEY[k].zero_stage == 3], x, gc_mode,
                            _smallest_plain_fit(walked))
            out += walked
    if why_not and nothing_without_offload:
        notes.append(f"Splitting each sequence over GPUs could shrink what grows with --seq-len {x.seq}, but "
                     + "; ".join(why_not) + ".")
    return out


# --- The longest sequence the machine takes -----------------------------------------------------------------------

@dataclass
class Longest:
    """The longest --seq-len over every rung the options allow, at micro-batch 1, and how it is reached."""

    seq_len: int
    key: str
    name: str
    gradient_checkpointing: bool
    loss: str
    code: CodeOptions = NO_CODE

    def to_json(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "rung": self.key, "name": self.name,
                "gradient_checkpointing": self.gradient_checkpointing, "loss": self.loss,
                "checkpoint_offload": self.code.checkpoint_offload, "tiled_mlp": self.code.tiled_mlp}

    @property
    def how(self) -> str:
        parts = (["gradient checkpointing"] if self.gradient_checkpointing else [])
        if self.code.checkpoint_offload:
            parts.append("checkpoints offloaded to the CPU")
        if self.code.tiled_mlp:
            parts.append("tiled MLP")
        parts.append({"full": "the full logits", "liger": "Liger's fused loss",
                      "tiled": "DeepSpeed's tiled loss"}[self.loss])
        return ", ".join(parts)


def longest_loss(training: TrainingOptions, x: _Inputs, model_type: str | None, hw) -> str:
    """The loss a sequence at the machine's limit would use: the one given, or for --loss auto the fused one
    (the logits of such a sequence are always a large share), where it can run."""
    if training.loss != "auto" or x.task != "causal-lm":
        return x.loss
    code = bool(training.allow_code_changes)
    if liger_problem(model_type, hw, x.cpu) is None and (training.trainer == "hf" or code):
        return "liger"
    return "tiled" if code else "full"


def _candidates(strategy: StrategyOptions, training: TrainingOptions, x: _Inputs, ladder: list[str]) -> list[str]:
    """The rungs whose longest sequence can be the machine's: every allowed split family at its largest size (the
    states are the same at every size; a larger split holds less of the sequence), and the ladder's rungs that have
    no splitting counterpart (ZeRO-3 with parameter offload, FSDP with CPU offload, ...). NVMe offload holds what CPU
    offload holds on the GPU and is left out."""
    out = [k for k in ladder if not BY_KEY[k].uses_nvme]
    families: dict[str, str] = {}
    if (strategy.sp_size or 1) > 1 or (strategy.cp_size or 1) > 1:
        return out
    if strategy.cp_size != 1 and _cp_problem(strategy, training, x) is None:
        for k in rung_table.context_parallel_keys(strategy.backend, strategy.offload, training.method,
                                                  x.per_machine, 2 * 8):
            families[_base_of(BY_KEY[k]) or k] = k
    if strategy.sp_size != 1 and _sp_problem(training, x) is None and x.world > 1:
        for k in _sp_keys(strategy, training, replace(x, seq=rung_table.ULYSSES_SIZES[-1])):
            families[_base_of(BY_KEY[k]) or k] = k
    covered = {_base_of(BY_KEY[k]) for k in families.values()}
    return [k for k in out if k not in covered] + list(families.values())


def _base_of(spec: rung_table.RungSpec) -> str | None:
    """The rung a split rung splits the sequence of: the same strategy over whole sequences."""
    same = (spec.backend, spec.zero_stage, spec.offload_optimizer, spec.offload_param, spec.fsdp_reshard)
    return next((r.key for r in rung_table.RUNGS if not r.splits_sequence and not r.replicate
                 and (r.backend, r.zero_stage, r.offload_optimizer, r.offload_param, r.fsdp_reshard) == same), None)


def machine_longest(strategy: StrategyOptions, training: TrainingOptions, x: _Inputs, ladder: list[str],
                    model_type: str | None, hw) -> Longest | None:
    """The longest --seq-len the machine takes over every rung the options allow (--backend, --zero-stage,
    --offload, a given split size, --allow-code-changes), at micro-batch 1 with gradient checkpointing (unless it is
    off) and the loss a sequence that long would use; None when no rung takes one token."""
    gc = training.gradient_checkpointing != "off"
    loss = longest_loss(training, x, model_type, hw)
    x = replace(x, batch=1, loss=loss, stack=seqmem.stack_for_loss(x.stack, loss, model_type))
    best: Longest | None = None
    for key in _candidates(strategy, training, x, ladder):
        spec = BY_KEY[key]
        options = [NO_CODE]
        if gc and x.code_changes and spec.backend == "deepspeed" and not x.cpu:
            options = [CODE_STEPS[-1], CODE_STEPS[1]]          # both (host RAM may bind the offload), tiled alone
        for code in options:
            seq = longest_seq_len(spec, x, gc, code)
            if seq and (best is None or seq > best.seq_len):
                best = Longest(seq, key, spec.label, gc, x.loss, code)
    return best
