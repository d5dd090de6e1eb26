"""Choosing among the rungs (the cheapest class, then the fastest) and the sentences that explain the choice.
"""

from __future__ import annotations

from wizard.planning import speed as speed_mod
from wizard.planning.plan_types import Rung
from wizard.planning.evaluate import _Inputs
from wizard.units import fmt_bytes


# --- Choosing a rung and saying why ----------------------------------------------------------------

# Rung classes in the order the product allows them: no offload while a rung without offload fits, and
# NVMe only when nothing on the host fits. Within a class the fastest rung that fits wins.
def _rung_class(rung: Rung) -> int:
    if "nvme" in (rung.offload_optimizer, rung.offload_param):
        return 2
    return 1 if rung.offloads else 0


rung_class = _rung_class       # the public name (split.py reads it)


# Speeds closer than this are a tie: the model is not that precise, and the earlier (cheaper, simpler) rung
# of the ladder wins one, so ZeRO-3 is never taken over ZeRO-2 for a rounding difference.
SPEED_TIE = 0.03


# Inside the tie, a rung that leaves less than this share of the usable memory to spare is "tight": the memory
# model's typical error is about this large (bench_memory_model: median |error| 5.5 % on the fit half, 3.1 %
# held out), so such a rung may not fit when measured. A tied rung with room is preferred to it: 4x RTX 4090, 7B
# gave the tie to ZeRO-2 + offload with 425 MiB to spare over ZeRO-3 + offload with 18 GiB (issue 29).
TIGHT_SPARE = 0.05


def tight(rung: Rung, usable: int | None) -> bool:
    return usable is not None and usable - rung.per_gpu_bytes < TIGHT_SPARE * usable


def _tied(rungs: list[Rung]) -> list[Rung]:
    """The fitting rungs of the cheapest class that has one, within SPEED_TIE of its fastest, in ladder order."""
    for cls in (0, 1, 2):
        fitting = [r for r in rungs if r.fits and _rung_class(r) == cls]
        if fitting:
            best = max(r.tokens_per_second for r in fitting)
            return [r for r in fitting if r.tokens_per_second >= best * (1 - SPEED_TIE)]
    return []


def choose(rungs: list[Rung], usable: int | None = None) -> Rung | None:
    """The fastest fitting rung of the cheapest class that has one; on a tie, the earlier rung that is not tight
    (`usable`: the per-GPU memory the rungs fit in; None: the earlier rung). One exception to "no offload while a
    rung without it fits" (offload_instead): the rung without offload fits only inside the memory model's error and
    an offload rung is faster, with room."""
    tied = _tied(rungs)
    roomy = [r for r in tied if not tight(r, usable)]
    pick = (roomy or tied or [None])[0]
    return offload_instead(rungs, pick, usable) or pick


# The memory model's measured error, what a rung's room is weighed against (bench/results/memory-model.md): the
# held-out half's median absolute error and its worst under-prediction of a reserved or whole-process peak.
HELD_OUT_MEDIAN_ERROR = 0.031
HELD_OUT_WORST_UNDER = 0.083


def offload_instead(rungs: list[Rung], pick: Rung | None, usable: int | None) -> Rung | None:
    """An offload rung to take instead of `pick`, a rung without offload that is tight (less than TIGHT_SPARE of the
    usable memory to spare: inside the memory model's measured error, so it may not fit when measured), or None: the
    fastest offload (CPU) rung that fits with room and is faster than `pick` beyond the tie, where no rung without
    offload that has room is as fast. 8 x V100-32GB, Llama-3-70B LoRA: FSDP2 + context parallel 4 with 435.6 MiB to
    spare (1.5 %) at 378 tok/s, against ZeRO-3 + CPU offload with 17 GiB at 406 tok/s (issue 36, item 5)."""
    if pick is None or _rung_class(pick) != 0 or not tight(pick, usable):
        return None
    faster = [r for r in rungs if r.fits and _rung_class(r) == 1 and not tight(r, usable)
              and r.tokens_per_second > pick.tokens_per_second * (1 + SPEED_TIE)]
    if not faster:
        return None
    best = max(faster, key=lambda r: r.tokens_per_second)
    roomy = [r for r in rungs if r.fits and _rung_class(r) == 0 and not tight(r, usable)
             and r.tokens_per_second >= best.tokens_per_second * (1 - SPEED_TIE)]
    return None if roomy else best


def tight_rung_passed(rungs: list[Rung], choice: Rung | None, usable: int | None) -> Rung | None:
    """The tight rung without offload that an offload choice was taken instead of (offload_instead), or None."""
    if choice is None or _rung_class(choice) != 1:
        return None
    tied = _tied(rungs)
    roomy = [r for r in tied if not tight(r, usable)]
    pick = (roomy or tied or [None])[0]
    return pick if pick is not None and offload_instead(rungs, pick, usable) is choice else None


def _error_clause() -> str:
    return (f"within the memory model's measured error (held out: median {HELD_OUT_MEDIAN_ERROR:.1%}, worst "
            f"under-prediction {HELD_OUT_WORST_UNDER:.1%}; bench/results/memory-model.md)")


def passed_for_room(rungs: list[Rung], choice: Rung | None, usable: int | None) -> list[Rung]:
    """The tied rungs before the choice on the ladder that it was preferred to because they are tight."""
    tied = _tied(rungs)
    if choice is None or choice not in tied:
        return []
    return [r for r in tied[:tied.index(choice)] if tight(r, usable)]


def _starved_threads(x: _Inputs) -> tuple[float, int] | None:
    """(threads the host optimizer step gets per process, the cores it could have) when OMP_NUM_THREADS leaves it
    fewer threads than its share of the machine's cores (speed.cpu_step_threads); None otherwise."""
    m = x.machine
    if m is None or x.cpu:
        return None
    cores = int(m.cpu_cores_per_process)
    return (m.threads, cores) if m.threads < cores else None


def _fit_reason(rung: Rung, x: _Inputs, without_gc: int | None, choice: Rung, tie: bool = False,
                forced_offload: str | None = None, passed: list[Rung] | tuple = (),
                tight_passed: Rung | None = None) -> str:
    """`forced_offload`: the --offload value when it left the ladder no rung of a cheaper class than the choice's,
    so the plan cannot say that nothing cheaper fits (it did not try). `passed`: the tied rungs before the choice
    that it was preferred to for room (passed_for_room)."""
    used = f"{fmt_bytes(rung.per_gpu_bytes)} of {fmt_bytes(x.usable)} usable per {x.unit}"
    gc = ""
    if without_gc is not None:
        gc = f", with gradient checkpointing switched on ({fmt_bytes(without_gc)} without it)"
    elif rung.gradient_checkpointing:
        gc = ", with gradient checkpointing (forced on)"
    rate = speed_mod.fmt_rate(rung.tokens_per_second)
    if rung is choice:
        spare = fmt_bytes(x.usable - rung.per_gpu_bytes)
        fastest = "the first rung that fits within 3% of the fastest" if tie else "the fastest rung that fits"
        room = ""
        if passed:
            fastest = "the first rung within 3% of the fastest that leaves room"
            room = (f" ({_names(passed)} {'leaves' if len(passed) == 1 else 'leave'} less than {TIGHT_SPARE:.0%} of "
                    "the usable memory to spare, within the memory model's typical error)")
        offload = (f"{fastest.replace(' rung', ' offload rung', 1)}" if passed else
                   "the fastest offload rung that fits")
        why = (fastest if _rung_class(rung) == 0 else
               f"{fastest} of those --offload {forced_offload} allows" if forced_offload else
               f"no rung without offload fits, and it is {offload}" if _rung_class(rung) == 1
               else "nothing fits without NVMe") + room
        if tight_passed is not None:
            why = (f"{speed_mod.relative(rung.speed, tight_passed.speed)} than {tight_passed.name}, the "
                   f"fastest rung without offload, which leaves only "
                   f"{fmt_bytes(x.usable - tight_passed.per_gpu_bytes)} to spare, {_error_clause()}")
        return f"Fits with {spare} to spare ({used}){gc}; ≈{rate}; chosen: {why}{_threads_clause(rung, x)}."
    rel = speed_mod.relative(rung.speed, choice.speed)
    if rung is tight_passed:
        return (f"Fits ({used}){gc}, {rel} (≈{rate}), but with only {fmt_bytes(x.usable - rung.per_gpu_bytes)} to "
                f"spare, {_error_clause()}: {choice.name}, with offload, is faster and has room.")
    slower = rung.tokens_per_second < choice.tokens_per_second * (1 - SPEED_TIE)
    if _rung_class(rung) > _rung_class(choice) and not slower:
        return f"Fits ({used}){gc}, {rel} (≈{rate}), but no offload while a rung without it fits."
    if not slower and rung in passed:
        return (f"Fits ({used}){gc}, {rel} (≈{rate}), but with only {fmt_bytes(x.usable - rung.per_gpu_bytes)} to "
                f"spare; {choice.name}, as fast with room, wins the tie.")
    if not slower:
        return f"Fits ({used}){gc}, {rel} (≈{rate}); the earlier rung ({choice.name}) wins the tie."
    because = _slower_because(rung, choice, x) + _measured_clause(rung, choice)
    return f"Fits ({used}){gc}, {rel} (≈{rate}): {because}{_threads_clause(rung, x)}."


def _measured_clause(rung: Rung, choice: Rung) -> str:
    """Which of the two speeds compared are scaled by a `wizard tune` ratio, and what it was measured on: a ratio
    measured on one model (or only for the choice) is never called a measurement of this rung on this model (an
    offload rung that never ran read "138.6x slower: as measured on this machine")."""
    def source(r: Rung) -> str | None:
        c = r.calibration or {}
        if not c.get("speed_ratio"):
            return None
        return (f"for {c['model']} " if c.get("model") else "") + f"on {c.get('date')}"
    own, theirs = source(rung), source(choice)
    if own and theirs:
        same = own == theirs
        return (f"; both speeds scaled by ratios `wizard tune` measured {own}" if same else
                f"; its speed scaled by a ratio `wizard tune` measured {own}, {choice.name}'s by one measured {theirs}")
    if own:
        return f"; its speed scaled by a ratio `wizard tune` measured {own}"
    if theirs:
        return f" ({choice.name}'s speed scaled by a ratio `wizard tune` measured {theirs}; this rung's is the model's)"
    return ""


def _names(rungs) -> str:
    names = [r.name for r in rungs]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _threads_clause(rung: Rung, x: _Inputs) -> str:
    """', its host step on 1 thread per process (OMP_NUM_THREADS, see the notes)' for an optimizer-offload rung
    whose step OMP_NUM_THREADS starves; '' otherwise."""
    starved = _starved_threads(x) if rung.offload_optimizer != "none" else None
    if starved is None:
        return ""
    threads, cores = starved
    return (f", its host step on {threads:g} thread{'s' if threads != 1 else ''} per process of {cores} cores "
            f"(OMP_NUM_THREADS, see the notes)")


def _slower_because(rung: Rung, choice: Rung, x: _Inputs | None = None) -> str:
    """What costs this rung its speed, in a few words."""
    smaller = _smaller_micro_batch(rung, choice)
    if smaller:
        return smaller
    if "nvme" in (rung.offload_optimizer, rung.offload_param):
        return "optimizer states swapped through NVMe"
    if rung.offload_param != "none":
        return "weights and optimizer on the CPU"
    if rung.offload_optimizer != "none":
        return "optimizer on the CPU"
    if rung.gradient_checkpointing and not choice.gradient_checkpointing:
        return "gradient checkpointing recomputes the forward pass"
    if rung.speed and rung.speed.bound == "communication":
        return "more communication per step"
    if rung.zero_stage == 3 and choice.fsdp_reshard:
        adapters = x is not None and x.adapters is not None
        return ("ZeRO-3 gathers weights module by module" +
                (", and the adapters add two modules (lora_A, lora_B) to each adapted Linear" if adapters else "") +
                "; FSDP2 gathers a whole layer at once")
    if rung.zero_stage == 3 or rung.fsdp_reshard:
        return "weights gathered for every layer, forward and backward"
    return "more communication per step"


def _smaller_micro_batch(rung: Rung, choice: Rung) -> str | None:
    """When the rung runs a smaller micro-batch of the same global batch than the choice, at the same
    checkpointing, and compute is the largest part of its longer step, that is the reason, not its
    communication (a rung that fits only micro-batch 1 was said to be slower for gathering its weights, with
    0 s of exposed communication)."""
    r, c = rung.speed, choice.speed
    if (r is None or c is None or rung.micro_batch >= choice.micro_batch
            or rung.gradient_checkpointing != choice.gradient_checkpointing):
        return None
    parts = ("compute_seconds", "communication_seconds", "offload_seconds", "optimizer_seconds", "overhead_seconds")
    gaps = {p: getattr(r, p) - getattr(c, p) for p in parts}
    if max(gaps, key=gaps.get) != "compute_seconds" or gaps["compute_seconds"] <= 0:
        return None
    largest = rung.max_micro_batch_gc if rung.gradient_checkpointing else rung.max_micro_batch
    which = " (the largest that fits)" if largest and rung.micro_batch >= largest else ""
    return (f"it runs micro-batch {rung.micro_batch}{which}, against {choice.micro_batch} for {choice.name}: "
            "smaller matrix multiplies use the GPU less well")
