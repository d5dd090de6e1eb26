"""The ladder: cheapest strategy that fits, with the per-GPU arithmetic of every rung.

Pure: takes Hardware, ModelShape and options, returns a Plan. Formulas live in memory.py. This module walks the
ladder (make_plan), sizes the batch (largest micro-batch, fastest split) and says what would fit; its parts live
beside it: plan_types (options and results), ladder (which rungs), resolve (inputs), evaluate (one rung's memory),
reasons (the choice and its sentences).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from wizard.errors import InputError
from wizard.planning import calibration as calibration_mod
from wizard.planning import rungs as rung_table
from wizard.planning import speed as speed_mod
from wizard.planning.rungs import BY_KEY, RungSpec
# The plan is split along its seams (plan_types, ladder, evaluate, reasons, resolve); every name stays importable
# from here, where callers and tests have always imported it.
from wizard.planning.plan_types import (  # noqa: F401
    Alternative, ATTENTIONS, BACKENDS, BatchSplit, COMPONENTS, GC_MODES, HEADROOM_ALLOWED, LOSS_CHOICES, MAX_HEADROOM,
    METHODS,
    OFFLOADS, OPTIMIZERS, Plan, PRECISIONS, Rung, _scaled_speed, SPLITS, StrategyOptions, Topology, TRAINERS,
    TrainingOptions, ZERO_STAGES,
)
from wizard.planning.ladder import _adapter_ladder, _check_choice, ladder_keys, RUNG_SPECS, _steppable_by  # noqa: F401
from wizard.planning.evaluate import (  # noqa: F401
    _activation_precision, _adapter_activation_bytes, _adapter_strategy, _autocast, _buffers, _capacity_text,
    _Estimate, _estimate, _evaluate, _FFN_INPUT_MODULES, _head_output_bytes, _host_ram, _Inputs, _load_bytes,
    _loader, _problems, _rung_optimizer, _sentence, _states,
)
from wizard.planning.reasons import (  # noqa: F401
    choose, _fit_reason, _rung_class, _slower_because, _smaller_micro_batch, SPEED_TIE, _starved_threads,
    passed_for_room, tight_rung_passed,
    _threads_clause,
)
from wizard.planning.fit import (  # noqa: F401
    _fits_gpu, _fits_seq, _layout, largest_micro_batch, longest_seq_len, MAX_MICRO_BATCH, MAX_SEQ_LEN, _mlp_params,
    _speed, seq_unit,
)
from wizard.planning.evaluate import code_of, CodeOptions, NO_CODE  # noqa: F401
from wizard.planning import split as split_mod
from wizard.planning.resolve import (  # noqa: F401
    activation_estimate, _active_params, ADAPTER_SAVE_BYTES, _available_host_ram, _fsdp1_note, _fsdp_version,
    liger_problem, LOSS_SHARE,
    layer_stack, method_json, nvme_free_bytes, _positive, _resolve, resolve_attention, resolve_precision, _task,
    _with_adapters,
)
from wizard.sizing import memory as mem
from wizard.sizing import sequence as seqmem
from wizard.sizing.checkpoint import checkpoint_size
from wizard.units import GiB, fmt_bytes

# --- Public API ---------------------------------------------------------------------------------------

def make_plan(hw, model, training: TrainingOptions, strategy: StrategyOptions, topology: Topology,
              adapters=None, calibration: calibration_mod.Calibration | None = None) -> Plan:
    """Walk the ladder of DESIGN.md and return every rung with its breakdown, speed and the choice.

    `adapters` (wizard.sizing.lora.AdapterShape) is required for --method lora/qlora on a model read from a config;
    a --params shape is sized analytically here. `calibration`: `wizard tune`'s ratios for this machine
    (calibration.for_machine), applied to every rung's speed and per-GPU memory before fit and choice; the plan
    says so, and names the raw model's choice when the calibration changed it."""
    plan = _make_plan(hw, model, training, strategy, topology, adapters, calibration)
    if calibration is None:
        return plan
    if calibration.problem:
        plan.notes.append(calibration.problem)
    if calibration.machine != calibration_mod.machine_key(hw, topology):
        return plan
    used = [(r.name, calibration.ratios(r.key, training.method)) for r in plan.rungs if r.calibration is not None]
    stale = sum(calibration.is_stale(r.key, training.method) for r in plan.rungs)
    changed = None
    if used:
        raw = _make_plan(hw, model, training, strategy, topology, adapters, None).choice
        if _choice_id(raw) != _choice_id(plan.choice):
            changed = (_choice_text(raw), _choice_text(plan.choice))
            plan.calibrated_from = raw.key if raw is not None else None
    plan.notes.extend(calibration_mod.notes(used, stale, changed, calibration_mod.model_label(model)))
    return plan


def _choice_id(rung: Rung | None) -> tuple | None:
    return None if rung is None else (rung.key, rung.gradient_checkpointing)


def _choice_text(rung: Rung | None) -> str:
    if rung is None:
        return "none (nothing fits)"
    return rung.name_with_gc


def _measured_network(topology: Topology, hw, calibration) -> Topology:
    """The network `wizard preflight --record` measured between these machines, in place of the class default
    (a given --inter-node-gbps or --assume ...,net= wins over it: the user said so)."""
    network = getattr(calibration, "network", None)
    if (network is None or topology.num_machines < 2 or topology.inter_node_gbps is not None
            or getattr(hw, "inter_node_gbps", None) is not None
            or calibration.machine != calibration_mod.machine_key(hw, topology)):
        return topology
    return replace(topology, inter_node_gbps=network.gbps, inter_node_source=network.source)


def _make_plan(hw, model, training: TrainingOptions, strategy: StrategyOptions, topology: Topology,
               adapters, calibration) -> Plan:
    notes: list[str] = []
    _check_choice(training.split, SPLITS, "split")
    training, auto_split = _split_training(training, topology, notes)
    topology = _measured_network(topology, hw, calibration)
    x = _resolve(hw, model, training, strategy, topology, notes)
    x = _with_adapters(x, model, training, adapters, notes)
    if calibration is not None and calibration.machine == calibration_mod.machine_key(hw, topology):
        x = replace(x, calibration=calibration)      # a variant on another machine (what_would_fit) stays raw
    train_tokens = _train_tokens(training)
    global_batch = _global_batch(training, x.world)
    ladder = ladder_keys(strategy, x.world, x.cpu, training.method)
    requested = split_mod.requested_keys(strategy, training, x)
    keys = _steppable_by(training.optimizer, strategy, requested if requested is not None else ladder)
    notes.extend(_fsdp1_note(x, keys))
    evaluated = [_evaluate(BY_KEY[k], x, training.gradient_checkpointing) for k in keys]
    extra = split_mod.split_rungs(strategy, training, x, evaluated, notes)
    if requested is None and strategy.fsdp_version == 2 and not x.cpu:
        # HSDP stays even where its states do not fit: the network note compares it with full sharding
        extra += [_evaluate(BY_KEY[k], x, training.gradient_checkpointing)
                  for k in rung_table.hsdp_keys(strategy.backend, strategy.offload, training.method, x.machines)]
    if extra:
        # Before the offload rungs: those without offload are the same class as the rungs without offload.
        at_offload = next((i for i, k in enumerate(keys) if BY_KEY[k].offloads), len(keys))
        evaluated[at_offload:at_offload] = [e for e in extra if not e[0].offloads]
        at_nvme = next((i for i, (r, _) in enumerate(evaluated) if BY_KEY[r.key].uses_nvme), len(evaluated))
        evaluated[at_nvme:at_nvme] = [e for e in extra if e[0].offloads]
        keys = [r.key for r, _ in evaluated]
    at: dict[str, _Inputs] = {k: x for k in keys}        # the inputs (micro-batch x accumulation) each rung runs
    splits: dict[str, BatchSplit] = {}
    if auto_split:
        # Every rung that fits runs its own fastest split of the global batch, so rungs (and LoRA against full
        # fine-tuning) are compared as each would really run, and the choice's figures are the split's.
        for i, (rung, _) in enumerate(evaluated):
            spec = BY_KEY[rung.key]
            split = fastest_split(spec, x, global_batch, training.gradient_checkpointing, None,
                                  code_of(rung)) if rung.fits else None
            if split is None:
                continue
            splits[rung.key] = replace(split, applied=True)
            at[rung.key] = replace(x, batch=split.micro_batch, grad_accum=split.grad_accum)
            evaluated[i] = _evaluate(spec, at[rung.key], training.gradient_checkpointing)
    rungs = [r for r, _ in evaluated]
    for rung in rungs:
        spec = BY_KEY[rung.key]
        rx = at[rung.key]
        rung.micro_batch, rung.grad_accum = rx.batch, rx.grad_accum
        code = code_of(rung)
        rung.speed = _speed(spec, rx, rx.batch, rx.grad_accum, rung.gradient_checkpointing, code)
        if train_tokens:
            rung.train_seconds = rung.speed.train_seconds(train_tokens)
        if training.gradient_checkpointing != "on":
            rung.max_micro_batch = largest_micro_batch(spec, x, gc=False)
        if training.gradient_checkpointing != "off":
            rung.max_micro_batch_gc = largest_micro_batch(spec, x, gc=True, code=code)
    choice = choose(rungs, x.usable)
    if choice is not None:
        tie = any(r.fits and _rung_class(r) == _rung_class(choice) and r.tokens_per_second > choice.tokens_per_second
                  for r in rungs)
        forced = (strategy.offload if strategy.offload in ("cpu", "nvme")
                  and not any(_rung_class(r) < _rung_class(choice) for r in rungs) else None)
        passed = passed_for_room(rungs, choice, x.usable)
        tight_passed = tight_rung_passed(rungs, choice, x.usable)
        for rung, without_gc in evaluated:
            if rung.fits:
                rung.reason = _fit_reason(rung, x, without_gc, choice, tie, forced, passed, tight_passed)
    if choice is not None and choice.fits:
        longest = longest_seq_len(BY_KEY[choice.key], at[choice.key], choice.gradient_checkpointing
                                  or training.gradient_checkpointing != "off", code_of(choice))
        if longest < NEAR_SEQ_LIMIT * x.seq:
            choice.max_seq_len = longest
    longest = split_mod.machine_longest(strategy, training, x, ladder, getattr(model, "model_type", None), hw)
    notes.extend(_omp_threads_note(rungs, choice, at))
    notes.extend(_logits_note(rungs, choice, at, hw, model, training))
    notes.extend(_network_note(rungs, choice, at))
    notes.extend(split_mod.ulysses_gradients_note(choice, hw))
    if x.nvme_path and x.nvme_free is None and any(BY_KEY[k].uses_nvme for k in keys):
        notes.append(f"Free space at the NVMe path {x.nvme_path} is unknown, so the NVMe rung's disk need is not "
                     "checked.")
    batch = None
    if choice is not None and choice.key in splits:
        batch = splits[choice.key]
    elif choice is not None:
        batch = fastest_split(BY_KEY[choice.key], x, global_batch,
                              training.gradient_checkpointing, choice.speed if choice.fits else None,
                              code_of(choice))
    amortised = None
    if choice is not None and choice.fits and choice.speed is not None and choice.speed.bound == "offload":
        amortised = _amortised(BY_KEY[choice.key], at[choice.key], choice, global_batch)
    plan = Plan(rungs=rungs, choice=choice, gpu_capacity_bytes=x.capacity, usable_bytes=x.usable,
                amortised=amortised, precision=x.precision, topology=topology, notes=notes, batch=batch,
                train_tokens=train_tokens, adapters=x.adapters, method=method_json(training, x.params, x.adapters),
                inter_node_gbps=x.machine.inter_node_gbps if x.machines > 1 else None, calibration=calibration,
                loss=x.loss, longest=longest)
    plan.checkpoint = plan_checkpoint(plan, x.params, training.optimizer, training.save_total_limit)
    return plan


def plan_checkpoint(plan: Plan, params: int, optimizer: str, save_total_limit: int | None,
                    fsdp_state_dict_type: str | None = None, gather_16bit: bool = True):
    """The disk one checkpoint of the plan's choice takes (sizing.checkpoint), from the rung's properties (backend,
    ZeRO stage, offload), never its key; the details answered after the plan (FSDP's state-dict type, ZeRO-3's
    16-bit gather) refine it (the pipeline calls it again with them). None without a choice."""
    c = plan.choice
    if c is None:
        return None
    adapters = plan.method.get("name", "full") != "full"
    return checkpoint_size(
        backend=c.backend, zero_stage=c.zero_stage, offload_optimizer=c.offload_optimizer, params=params,
        trainable_params=int(plan.method.get("trainable_params") or params), adapters=adapters,
        precision=plan.precision, optimizer=optimizer, num_machines=plan.topology.num_machines,
        processes_per_machine=plan.topology.processes_per_machine, save_total_limit=save_total_limit,
        fsdp_state_dict_type=fsdp_state_dict_type or "SHARDED_STATE_DICT", gather_16bit=gather_16bit)


def _network_note(rungs: list[Rung], choice: Rung | None, at: dict[str, _Inputs]) -> list[str]:
    """With two machines or more: HSDP against the full-sharding rungs of the ladder (ZeRO-3, FSDP2 resharding over
    every process), by what each sends over the network between machines per step and the step time that makes at
    the network the plan uses; names the faster and why, and whether it fits."""
    hsdp = next((r for r in rungs if BY_KEY[r.key].replicate and r.speed is not None), None)
    full = [r for r in rungs if r.speed is not None and not r.offloads and r.cp_size == 1
            and not BY_KEY[r.key].replicate and (r.zero_stage == 3 or (r.backend == "fsdp" and r.fsdp_reshard))]
    if hsdp is None or not full:
        return []
    x = at[hsdp.key]
    m = x.machine

    def sent(r: Rung) -> float:
        rx = at[r.key]
        spec = BY_KEY[r.key]
        work = speed_mod.Workload(matmul_params=rx.active_params, params=rx.params, layers=rx.layers,
                                  hidden=rx.hidden, seq=rx.seq, micro_batch=rx.batch, grad_accum=rx.grad_accum,
                                  precision=rx.precision, flash=rx.flash, gradient_checkpointing=r.gradient_checkpointing,
                                  trainable_params=None if rx.adapters is None else rx.adapters.trainable_params)
        return speed_mod.network_bytes_per_step(work, _layout(spec, rx))

    def clause(r: Rung) -> str:
        fit = "" if r.fits else ", does not fit"
        return (f"{r.name} sends {sent(r) / 1e9:.3g} GB per machine per step over the network and takes "
                f"≈{r.speed.step_seconds:.3g} s per step (≈{speed_mod.fmt_rate(r.tokens_per_second)}{fit})")

    compared = [hsdp] + full
    fastest = max(compared, key=lambda r: r.tokens_per_second)
    least = min(compared, key=sent)
    runner = max((r for r in compared if r is not fastest), key=lambda r: r.tokens_per_second)
    gap = runner.speed.step_seconds - fastest.speed.step_seconds
    by_network = runner.speed.communication_seconds - fastest.speed.communication_seconds
    if gap > 0 and by_network >= 0.5 * gap:
        why = (f"{by_network:.3g} s less waiting on communication each step than {runner.name}"
               + (" (only its gradient all-reduce crosses machines; full sharding also gathers the weights across "
                  "them twice per micro-step)" if fastest is hsdp else ""))
    else:
        why = (f"not the network, whose traffic hides behind compute at this speed: {runner.name} loses on its "
               "per-layer overheads and optimizer work")
    memory = (f" HSDP shards the states over the {x.per_machine} GPUs of a machine, not all {x.world}: "
              f"{fmt_bytes(hsdp.per_gpu_bytes)} per GPU{'' if hsdp.fits else ', more than fits'}.")
    return [f"Across machines ({m.inter_node_gbps:g} Gb/s per machine, {m.inter_node_source}): "
            + "; ".join(clause(r) for r in compared) + f". {least.name} keeps the network least busy; "
            f"{fastest.name} is the fastest here: {why}.{memory}"]


# The logits are worth a note when they take at least this share of a GPU's usable memory on the rung shown (the
# share at which --loss auto takes a fused loss, resolve.LOSS_SHARE).
LOGITS_NOTE_SHARE = LOSS_SHARE


def _logits_note(rungs: list[Rung], choice: Rung | None, at: dict[str, _Inputs], hw=None, model=None,
                 training: TrainingOptions | None = None) -> list[str]:
    """What the loss's full logits cost at this sequence length (the chosen rung's, else the smallest rung's), where
    the plan counts them (--loss full, or auto where no fused loss can run), and what would avoid them: Liger
    Kernel's fused linear cross-entropy (--loss liger) or DeepSpeed's tiled loss (--loss tiled, code changes); and,
    where --loss auto could not take Liger, why."""
    rung = choice if choice is not None else min(rungs, key=lambda r: r.per_gpu_bytes, default=None)
    if rung is None:
        return []
    x = at[rung.key]
    logits = rung.breakdown.get("logits", 0)
    if x.task != "causal-lm" or x.loss != "full" or x.usable <= 0 or logits < LOGITS_NOTE_SHARE * x.usable:
        return []
    seq = x.seq // max(rung.seq_shards, 1)
    fused = seqmem.loss_bytes("liger", seq, x.batch, x.vocab, x.hidden, x.precision)
    split = f" (1/{rung.seq_shards} of each sequence)" if rung.seq_shards > 1 else ""
    asked = training is not None and training.loss == "full"
    problem = liger_problem(getattr(model, "model_type", None), hw, x.cpu) if hw is not None else None
    if asked:
        why = "--loss full was asked, so the plan counts them."
    elif problem:
        why = (f"--loss auto did not take Liger: {problem}; DeepSpeed's tiled loss (--loss tiled) runs anywhere, "
               "with lines in the training script (--allow-code-changes yes).")
    else:
        why = ("--loss auto did not take Liger: with your own Accelerate loop it needs a line in the script "
               "(--allow-code-changes yes, or --loss liger with it).")
    return [f"Logits: the loss materialises {seq:,} tokens{split} x micro-batch {x.batch} x {x.vocab:,} vocabulary "
            f"logits per GPU, {fmt_bytes(logits)} at its peak on {rung.name} (12 B each: transformers' loss upcasts "
            f"the 16-bit logits to fp32, and backward holds the log-softmax with the incoming and outgoing "
            f"gradients; measured, bench/measure_activations.py --logits). A fused linear cross-entropy never "
            f"materialises them: Liger Kernel's would hold about {fmt_bytes(fused)} (--loss liger; measured with a "
            f"port of it, bench/measure_sequence_memory.py). {why}"]


def _omp_threads_note(rungs: list[Rung], choice: Rung | None, at: dict[str, _Inputs]) -> list[str]:
    """What OMP_NUM_THREADS costs the optimizer-offload rungs, and the export that fixes it: the chosen rung when it
    offloads, else the fastest offload rung that fits."""
    offload = [r for r in rungs if r.fits and r.offload_optimizer != "none" and r.speed is not None]
    if not offload:
        return []
    rung = choice if choice is not None and choice in offload else max(offload, key=lambda r: r.tokens_per_second)
    rx = at[rung.key]
    starved = _starved_threads(rx)
    if starved is None:
        return []
    threads, cores = starved
    spec = BY_KEY[rung.key]
    full = _speed(spec, replace(rx, machine=replace(rx.machine, cpu_step_threads=float(cores))), rx.batch,
                  rx.grad_accum, rung.gradient_checkpointing)
    why = ("torchrun sets OMP_NUM_THREADS=1 for each of a machine's processes when it is not set"
           if threads == 1 and rx.per_machine > 1 else f"OMP_NUM_THREADS is {threads:g}")
    return [f"CPU offload: the host optimizer step runs on OpenMP's threads, {threads:g} per process ({why}), of "
            f"the {cores} cores each of the {rx.per_machine} processes per machine could use. Run "
            f"`export OMP_NUM_THREADS={cores}` before `wizard launch` (or accelerate launch): {rung.name} then takes "
            f"≈{full.step_seconds:.3g} s per optimizer step instead of ≈{rung.speed.step_seconds:.3g} s "
            f"(the host's memory bandwidth, not its cores, caps it beyond that)."]


# --- Speed: the fastest rung that fits, the largest micro-batch, the best batch split ----------------

# The plan shows the longest sequence that fits when the asked one is within this factor of it: near the limit.
NEAR_SEQ_LIMIT = 2


def _global_batch(training: TrainingOptions, world: int) -> int:
    if training.global_batch is None:
        return training.micro_batch * training.grad_accum * world
    g = _positive(training.global_batch, "--global-batch")
    if g % world:
        raise InputError("--global-batch", f"{g} is not a multiple of the {world} processes",
                         f"a multiple of {world}")
    return g


def _amortised(spec: RungSpec, x: _Inputs, choice: Rung, global_batch: int) -> BatchSplit | None:
    """An offload rung pays its CPU optimizer step (and the upload of the updated weights) once per optimizer step,
    whatever the tokens in it: the same rung at its largest micro-batch, accumulation unchanged, shows what that is
    worth (a larger global batch: say so). None when no larger micro-batch fits."""
    largest = max(choice.max_micro_batch, choice.max_micro_batch_gc)
    if largest <= x.batch:
        return None
    gc = largest > choice.max_micro_batch
    speed = _speed(spec, x, largest, x.grad_accum, gc, code_of(choice) if gc else NO_CODE)
    return BatchSplit(largest * x.grad_accum * x.world, largest, x.grad_accum, gc, speed, choice.speed)


def _split_training(training: TrainingOptions, topology: Topology, notes: list[str]) -> tuple[TrainingOptions, bool]:
    """The micro-batch and accumulation the ladder is walked with, and whether each rung then takes its fastest
    split of --global-batch (True only when neither --micro-batch nor --grad-accum was given: given ones win)."""
    if training.global_batch is None:
        return replace(training, split="given"), False
    world = _positive(topology.num_machines, "--num-machines") * _positive(topology.processes_per_machine,
                                                                          "--num-processes")
    g = _global_batch(training, world)
    per = g // world
    if training.split == "auto":
        return replace(training, micro_batch=1, grad_accum=per), True
    if training.split in ("micro", "accum"):
        # One of the two was given: the other follows from the global batch.
        flag, given = (("--micro-batch", training.micro_batch) if training.split == "micro"
                       else ("--grad-accum", training.grad_accum))
        given = _positive(given, flag)
        if per % given:
            raise InputError(flag, f"{given} does not divide the {per} samples per process of --global-batch {g}",
                             f"a divisor of {per}")
        other = per // given
        if training.split == "micro":
            notes.append(f"--micro-batch {given} was given: accumulation {other} makes the global batch of {g}.")
            return replace(training, grad_accum=other, split="given"), False
        notes.append(f"--grad-accum {given} was given: micro-batch {other} makes the global batch of {g}.")
        return replace(training, micro_batch=other, split="given"), False
    own = training.micro_batch * training.grad_accum * world
    if own != g:
        notes.append(f"--micro-batch {training.micro_batch} and --grad-accum {training.grad_accum} were given: they "
                     f"win, so a step takes {own} samples, not the --global-batch of {g}.")
    return replace(training, global_batch=None), False


def _train_tokens(training: TrainingOptions) -> int | None:
    if training.train_tokens is not None:
        return _positive(training.train_tokens, "--train-tokens")
    if training.dataset_tokens is None:
        return None
    tokens = _positive(training.dataset_tokens, "--dataset-tokens")
    epochs = 1.0 if training.epochs is None else training.epochs
    if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or not 0 < epochs <= 10_000:
        raise InputError("--epochs", f"{epochs!r} is not a positive number of epochs", "e.g. 1, 3 or 0.5")
    return max(int(tokens * epochs), 1)


def _divisors_up_to(n: int, limit: int) -> list[int]:
    """Divisors of n that are <= limit, ascending, in O(min(sqrt(n), limit)) steps."""
    out = set()
    root = math.isqrt(n)
    if root <= limit:
        for d in range(1, root + 1):
            if n % d == 0:
                out.update(v for v in (d, n // d) if v <= limit)
    else:
        out.update(d for d in range(1, limit + 1) if n % d == 0)
    return sorted(out)


def fastest_split(spec: RungSpec, x: _Inputs, global_batch: int, gc_mode: str,
                  current: speed_mod.Speed | None, code: CodeOptions = NO_CODE) -> BatchSplit | None:
    """Among micro-batch x accumulation splits of `global_batch` that fit on this rung, the fastest.

    Gradient checkpointing follows the mode: off/on as asked; auto uses it only for micro-batches that do
    not fit without it (the rung's code options with it). None when no split fits (not even micro-batch 1). A rung
    that splits each sequence over sp (cp) GPUs has each group's micro-batch (they share every sequence): the
    global batch splits over world / sp of them."""
    per_gpu = global_batch // (x.world // spec.seq_shards)
    limits = {False: largest_micro_batch(spec, x, False) if gc_mode != "on" else 0,
              True: largest_micro_batch(spec, x, True, code) if gc_mode != "off" else 0}
    best: BatchSplit | None = None
    for b in _divisors_up_to(per_gpu, max(limits.values())):
        gc = not (b <= limits[False])
        speed = _speed(spec, x, b, per_gpu // b, gc, code if gc else NO_CODE)
        if best is None or speed.tokens_per_second > best.speed.tokens_per_second * (1 + 1e-9):
            best = BatchSplit(global_batch, b, per_gpu // b, gc, speed, current)
    return best


def rung_by_key(plan: Plan, key: str) -> Rung | None:
    """The evaluated rung with this key, or None when the plan's ladder did not include it."""
    return next((r for r in plan.rungs if r.key == key), None)


def next_rung(plan: Plan, current_key: str) -> Rung | None:
    """What to try after `current_key` failed (e.g. CUDA OOM): the first later rung that fits,
    else the next rung up the ladder; None when `current_key` is the last rung or unknown."""
    return rung_table.next_after(plan.rungs, current_key, lambda r: r.key, lambda r: r.fits)


def shortfall(rung: Rung, plan: Plan, hw, strategy: StrategyOptions) -> tuple[float, str]:
    """(need / have of the tightest constraint, a phrase saying it) for a rung that does not fit."""
    unit = "process" if plan.topology.cpu else "GPU"
    usable = max(plan.usable_bytes, 1)
    failures = []
    if rung.per_gpu_bytes > plan.usable_bytes:
        failures.append((rung.per_gpu_bytes / usable,
                         f"needs {fmt_bytes(rung.per_gpu_bytes)} per {unit}, "
                         f"{fmt_bytes(rung.per_gpu_bytes - plan.usable_bytes)} "
                         f"({(rung.per_gpu_bytes / usable - 1) * 100:.0f}%) more than the "
                         f"{fmt_bytes(plan.usable_bytes)} usable"))
    if rung.load_bytes > plan.usable_bytes:
        failures.append((rung.load_bytes / usable,
                         f"needs {fmt_bytes(rung.load_bytes)} per {unit} while loading (bitsandbytes quantises the "
                         f"whole model onto every GPU before it is sharded), "
                         f"{fmt_bytes(rung.load_bytes - plan.usable_bytes)} "
                         f"({(rung.load_bytes / usable - 1) * 100:.0f}%) more than the "
                         f"{fmt_bytes(plan.usable_bytes)} usable"))
    ram = _available_host_ram(hw)
    if ram and not plan.topology.cpu and rung.cpu_bytes > ram:
        failures.append((rung.cpu_bytes / ram,
                         f"needs {fmt_bytes(rung.cpu_bytes)} of host RAM per machine, "
                         f"{fmt_bytes(rung.cpu_bytes - ram)} ({(rung.cpu_bytes / ram - 1) * 100:.0f}%) more than "
                         f"the {fmt_bytes(ram)} available"))
    if failures:
        return max(failures)
    # Memory fits: only the NVMe side is missing (no path, or not enough free disk).
    path = strategy.nvme_path or hw.nvme_path
    free = nvme_free_bytes(hw, path)
    if path and free and rung.nvme_bytes > free:
        return (rung.nvme_bytes / free,
                f"needs {fmt_bytes(rung.nvme_bytes)} on NVMe at {path}, {fmt_bytes(rung.nvme_bytes - free)} "
                f"({(rung.nvme_bytes / free - 1) * 100:.0f}%) more than the {fmt_bytes(free)} free")
    return (1.0, "fits in GPU memory and host RAM but needs an NVMe path (--nvme-path)")


def closest_shortfall(plan: Plan, hw, strategy: StrategyOptions) -> tuple[float, str, Rung] | None:
    """(need / have, the phrase, the rung) of the rung closest to fitting: exit 3's first sentence, and every
    front end that names why a machine does not fit (`wizard compare`'s rows) says the same. None when a rung fits
    or there is none."""
    misses = [(shortfall(r, plan, hw, strategy), r) for r in plan.rungs if not r.fits]
    if not misses:
        return None
    (ratio, phrase), rung = min(misses, key=lambda m: m[0][0])
    return ratio, phrase, rung


_MAX_MACHINES_TRIED = 128
_MAX_SPLITS_TRIED = 24


def _spread(values: list[int], most: int) -> list[int]:
    """At most `most` of the sorted `values`, evenly spread and always keeping the largest."""
    if len(values) <= most:
        return values
    step = (len(values) - 1) / (most - 1)
    return sorted({values[round(i * step)] for i in range(most)})


def _try(hw, model, training, strategy, topology, adapters=None, calibration=None) -> Plan | None:
    try:
        plan = _make_plan(hw, model, training, strategy, topology, adapters, calibration)
    except InputError:
        return None
    return plan if plan.choice is not None else None


def _fits_text(plan: Plan) -> str:
    c = plan.choice
    unit = "process" if plan.topology.cpu else "GPU"
    return f"{c.name_with_gc} fits ({fmt_bytes(c.per_gpu_bytes)} of {fmt_bytes(plan.usable_bytes)} per {unit})"


@dataclass
class Suggestion:
    """One change that makes a rung fit, already verified by recomputing the plan with it."""

    text: str                             # "with 16 GPUs (2 machines x 8): DeepSpeed ZeRO-3 fits (...)"
    training: TrainingOptions
    strategy: StrategyOptions
    topology: Topology
    choice_key: str


def what_would_fit(hw, model, training: TrainingOptions, strategy: StrategyOptions,
                   topology: Topology, adapters=None, calibration=None) -> list[Suggestion]:
    """Single changes that make some rung fit, each verified by recomputing the plan.

    `adapters`: the plan's AdapterShape for --method lora/qlora (Plan.adapters). No change tried here alters
    the LoRA options, so every variant is planned with the same adapters. `calibration`: the plan's
    (Plan.calibration), so a variant fits by the same measured figures."""
    out: list[Suggestion] = []

    def plan_for(t: TrainingOptions, s: StrategyOptions, topo: Topology) -> Plan | None:
        return _try(hw, model, t, s, topo, adapters, calibration)

    def attempt(label: str, t: TrainingOptions = training, s: StrategyOptions = strategy,
                topo: Topology = topology, without_offload: bool = False) -> bool:
        plan = plan_for(t, s, topo)
        if plan is None or (without_offload and BY_KEY[plan.choice.key].offloads):
            return False
        out.append(Suggestion(f"{label}: {_fits_text(plan)}", t, s, topo, plan.choice.key))
        return True

    # More GPUs: first the rest of this machine's GPUs, then more machines like it.
    candidates = []
    if not topology.cpu:
        candidates = [replace(topology, processes_per_machine=p)
                      for p in range(topology.processes_per_machine + 1, hw.num_gpus + 1)]
    per_machine = topology.processes_per_machine if topology.cpu else max(topology.processes_per_machine,
                                                                          hw.num_gpus)
    candidates += [replace(topology, processes_per_machine=per_machine, num_machines=m)
                   for m in range(topology.num_machines + 1, _MAX_MACHINES_TRIED + 1)]
    unit = "processes" if topology.cpu else "GPUs"
    for topo in candidates:
        where = f" ({topo.num_machines} machines x {topo.processes_per_machine})" if topo.num_machines > 1 else ""
        if attempt(f"with {topo.world_size} {unit}{where}", topo=topo):
            break
    # A smaller micro-batch: bisection finds the largest that fits (fitting shrinks monotonically with the
    # micro-batch, so log2 plans), then among the splits of the same global batch up to it the fastest
    # plan wins, cheapest rung class first: "--micro-batch 8 --grad-accum 8" on ZeRO-2 beats
    # "--micro-batch 38" that only fits with offload.
    total = training.micro_batch * training.grad_accum

    def smaller(b: int) -> TrainingOptions:
        return replace(training, micro_batch=b, grad_accum=total // b if total % b == 0 else training.grad_accum)

    if training.micro_batch > 1 and plan_for(smaller(1), strategy, topology) is not None:
        low, high = 1, training.micro_batch          # low fits, high does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if plan_for(smaller(mid), strategy, topology) is not None else (low, mid)
        best: tuple[tuple, int] | None = None
        for b in _spread(_divisors_up_to(total, low), _MAX_SPLITS_TRIED):
            plan = plan_for(smaller(b), strategy, topology)
            if plan is not None:
                rank = (-_rung_class(plan.choice), plan.choice.tokens_per_second)
                if best is None or rank > best[0]:
                    best = (rank, b)
        b = best[1] if best is not None else low
        keep = f" and --grad-accum {total // b} to keep the global batch of {total}" if total % b == 0 else ""
        attempt(f"with --micro-batch {b}{keep}", t=smaller(b))
    if training.gradient_checkpointing != "on":
        attempt("with --gradient-checkpointing on", t=replace(training, gradient_checkpointing="on"))
    seq = training.seq_len // 2
    while seq >= 128 and not attempt(f"with --seq-len {seq}", t=replace(training, seq_len=seq)):
        seq //= 2
    precision = resolve_precision(training.precision, hw, topology.cpu)
    if not topology.cpu and not resolve_attention(training.attention, precision, topology.cpu):
        attempt("with --attention sdpa", t=replace(training, attention="sdpa"))
    if training.optimizer == "adamw":
        # 8-bit AdamW is never paired with CPU offload (memory.optimizer_for_rung): suggested only
        # where the rung it makes fit keeps the optimizer states on the GPU
        attempt("with --optimizer adamw-8bit", t=replace(training, optimizer="adamw-8bit"), without_offload=True)
    if (strategy.backend, str(strategy.zero_stage), strategy.offload) != ("auto", "auto", "auto"):
        attempt("with --backend auto --zero-stage auto --offload auto",
                s=replace(strategy, backend="auto", zero_stage="auto", offload="auto"))
    return out


def _host_ram_is_short(plan: Plan, hw, model, training: TrainingOptions, strategy: StrategyOptions,
                       topology: Topology) -> str:
    """When a rung fits on the GPUs and only host RAM stops it: which, how much RAM it needs against what the
    machine has, and the RAM that makes the plan fit (verified by re-planning); "" otherwise."""
    ram = _available_host_ram(hw)
    if not ram or plan.topology.cpu:
        return ""
    short = [r for r in plan.rungs if not r.fits and r.per_gpu_bytes <= plan.usable_bytes and r.cpu_bytes > ram
             and not BY_KEY[r.key].uses_nvme]
    if not short:
        return ""
    rung = min(short, key=lambda r: (_rung_class(r), r.cpu_bytes))
    assumed = hw.source.startswith("assume:")
    total = hw.ram_total or ram
    need_total = _whole_ram_for(rung.cpu_bytes, hw)
    richer = with_host_ram(hw, need_total)
    fixed = _try(hw=richer, model=model, training=training, strategy=strategy, topology=topology,
                 adapters=plan.adapters, calibration=plan.calibration)
    have = (f"the machine has {fmt_bytes(ram)} available ({fmt_bytes(total)} in all)" if total != ram
            else f"the machine has {fmt_bytes(ram)}")
    text = (f"Host RAM is what stops {rung.name}: it fits on the {'GPU' if plan.topology.world_size == 1 else 'GPUs'}"
            f" ({fmt_bytes(rung.per_gpu_bytes)} of {fmt_bytes(plan.usable_bytes)} per GPU) but needs "
            f"{fmt_bytes(rung.cpu_bytes)} of host RAM per machine, and {have}.")
    if fixed is not None:
        how = (f"--assume ...,ram={need_total // GiB}G" if assumed else "a machine with that much")
        text += (f" With {fmt_bytes(need_total)} of RAM ({how}) {_fits_text(fixed)}"
                 f"{', ≈' + speed_mod.fmt_rate(fixed.choice.tokens_per_second) if fixed.choice.speed else ''}.")
    return text


def explain_nothing_fits(plan: Plan, hw, model, training: TrainingOptions, strategy: StrategyOptions,
                         topology: Topology) -> str:
    """For exit 3: how far the closest rung is from fitting, and what would fit (each one verified)."""
    closest = closest_shortfall(plan, hw, strategy)
    lines = []
    phrase = ""
    ram_text = _host_ram_is_short(plan, hw, model, training, strategy, topology)
    if closest is not None:
        _, phrase, best = closest
        lines.append(f"Nothing fits. The closest rung, {best.name}, {phrase}.")
    else:
        lines.append("Nothing fits.")
    raw = rung_by_key(plan, plan.calibrated_from) if plan.calibrated_from else None
    if raw is not None:
        lines.append(f"The raw model would choose {raw.name}: the memory `wizard tune` measured on this machine is "
                     "what rules it out (`--no-calibration` shows the raw model).")
    if ram_text:
        # Host RAM, not GPU memory, stops a rung that fits on the GPUs: say how much would do, before the
        # other changes (more GPUs) that also make something fit.
        lines.append(ram_text)
    nvme_missing = any(BY_KEY[r.key].uses_nvme and "--nvme-path" in r.reason for r in plan.rungs)
    if nvme_missing and "--nvme-path" not in phrase:
        lines.append("NVMe offload (the last rung) was not possible: give --nvme-path on a fast local disk.")
    fixes = what_would_fit(hw, model, training, strategy, topology, adapters=plan.adapters,
                           calibration=plan.calibration)
    if fixes:
        lines.append("What would fit: " + "; ".join(f.text for f in fixes) + ".")
    else:
        per = int(topology.processes_per_machine)
        more = (f"more machines of {per} CPU process{'es' if per != 1 else ''}, up to {_MAX_MACHINES_TRIED}"
                if topology.cpu else f"more GPUs, up to {_MAX_MACHINES_TRIED} machines")
        lines.append(f"No single change tried ({more}; a smaller micro-batch, gradient checkpointing, a shorter "
                     "sequence, SDPA attention, 8-bit AdamW) makes a rung fit.")
    return " ".join(lines)


def host_ram_to_fit(plan: Plan, hw) -> int | None:
    """The least total host RAM per machine with which some rung of `plan` would fit, or None when RAM is not
    what stops them (every rung also misses GPU memory). NVMe rungs are left out: more RAM is the cure for the
    CPU-offload rungs, NVMe the last resort. The share of the total that is available now (an assumed
    machine: 90 %) is kept. Not verified: re-plan with `with_host_ram` to be sure."""
    ram = _available_host_ram(hw)
    if not ram or plan.topology.cpu:
        return None
    needs = [r.cpu_bytes for r in plan.rungs
             if not r.fits and r.per_gpu_bytes <= plan.usable_bytes and r.cpu_bytes > ram
             and not BY_KEY[r.key].uses_nvme]
    if not needs:
        return None
    return _whole_ram_for(min(needs), hw)


def _whole_ram_for(need: int, hw) -> int:
    """The total host RAM per machine that leaves `need` available, in whole 16 GiB as RAM is sold. The share
    of the total that is available now is kept (an assumed machine: 90 %; a probed one what is free now)."""
    ram = _available_host_ram(hw) or need
    total = math.ceil(need * (hw.ram_total or ram) / ram)
    return -(-total // (16 * GiB)) * 16 * GiB


def with_host_ram(hw, total: int):
    """The same machine with `total` bytes of host RAM, the same share of it available."""
    ram = _available_host_ram(hw) or total
    share = ram / (hw.ram_total or ram)
    return replace(hw, ram_total=total, ram_available=int(total * share))


@dataclass
class RungAt:
    """One rung at given options outside any ladder (bench/bench_long_sequence.py compares it with published runs):
    its per-GPU and host bytes, its speed, and the longest sequence it takes at micro-batch 1."""

    per_gpu_bytes: int
    cpu_bytes: int
    breakdown: dict
    speed: speed_mod.Speed
    longest: int


def rung_at(hw, model, training: TrainingOptions, strategy: StrategyOptions, topology: Topology, key: str,
            code: CodeOptions = NO_CODE, gc: bool = True) -> RungAt:
    """The rung `key` at exactly these options (its size, its loss, its code options, gradient checkpointing)."""
    x = _resolve(hw, model, training, strategy, topology, [])
    spec = BY_KEY[key]
    est = _estimate(spec, x, gc, code)
    return RungAt(est.per_gpu, est.cpu, est.breakdown, _speed(spec, x, x.batch, x.grad_accum, gc, code),
                  longest_seq_len(spec, replace(x, batch=1), gc, code))
