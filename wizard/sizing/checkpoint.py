"""The disk one checkpoint of a rung takes, and what `save_total_limit` makes of it.

What each engine writes at a Trainer save (checked against the checkpoints the suite's real runs save:
tests/functional/test_checkpoint_resume.py compares these figures with the files, and wizard/checkpoint/layout.py
reads the same files):
- DeepSpeed ZeRO-1/2: rank 0's mp_rank_00_model_states.pt holds the whole module in the working dtype, and the
  Trainer's save_model writes model.safetensors in it too; every rank writes its partition of the optimizer: the
  fp32 master weights and the optimizer's states (4 + its bytes per trainable parameter, also in fp32 training,
  where the fp32 partition is kept beside the states).
- DeepSpeed ZeRO-3: no module in the model-states files (parameter shapes only); save_model gathers the 16-bit
  weights (stage3_gather_16bit_weights_on_model_save, which the wizard writes) into model.safetensors on rank 0;
  the optimizer partitions as above.
- FSDP with SHARDED_STATE_DICT (FSDP2's default): the fp32 parameters and the optimizer's states as
  torch.distributed.checkpoint shards, each rank its 1/world; save_model writes no weights. FULL_STATE_DICT: rank 0
  writes both whole, and save_model the weights once more.
- DDP / one process: rank 0 writes the fp32 weights (the Trainer's AMP keeps the parameters in fp32) and the
  optimizer's states.
- LoRA / QLoRA: the adapters (fp32) and their optimizer's states only; the frozen base is never saved (the Trainer
  passes exclude_frozen_parameters to DeepSpeed for a peft model).
Plus the scheduler, the RNG state of every rank and the Trainer's JSON: a few KiB each.

`keep`: the checkpoints on disk at the worst moment. The Trainer deletes the oldest (save_total_limit) only after
the new one is written, so that is save_total_limit + 1; without a limit it keeps every checkpoint, and the figure
is for the last one and the one being written (2), said as an assumption.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wizard.sizing.memory import FP32_MASTER_BYTES, optimizer_for_rung, optimizer_state_bytes, working_bytes

SMALL_FILES_PER_RANK = 16 * 1024        # rng_state_<rank>.pth (~14 KiB measured)
SMALL_FILES = 64 * 1024                 # scheduler.pt, trainer_state.json, training_args.bin, config.json, ...
UNLIMITED_KEEP = 2


@dataclass(frozen=True)
class CheckpointSize:
    bytes: int                  # one checkpoint, all ranks together
    per_node_bytes: int         # the most one machine writes for one checkpoint
    keep: int                   # checkpoints on disk at once (save_total_limit + the one being written)
    total_bytes: int            # bytes x keep, plus the final export
    per_node_total_bytes: int
    parts: dict[str, int]       # weights, optimizer, scheduler and RNG
    export_bytes: int           # the final save_model (or the export of a sharded save)
    save_total_limit: int | None
    layout: str                 # what is written, in words
    assumptions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "per_node_bytes": self.per_node_bytes, "keep": self.keep,
                "total_bytes": self.total_bytes, "per_node_total_bytes": self.per_node_total_bytes,
                "parts": dict(self.parts), "export_bytes": self.export_bytes,
                "save_total_limit": self.save_total_limit, "layout": self.layout,
                "assumptions": list(self.assumptions)}


def checkpoint_size(*, backend: str, zero_stage: int | None, offload_optimizer: str, params: int,
                    trainable_params: int, adapters: bool, precision: str, optimizer: str, num_machines: int,
                    processes_per_machine: int, save_total_limit: int | None = None,
                    fsdp_state_dict_type: str = "SHARDED_STATE_DICT", gather_16bit: bool = True) -> CheckpointSize:
    """One checkpoint of the rung described by these properties (no rung keys: any rung with these properties)."""
    world = max(1, num_machines * processes_per_machine)
    per_node_share = processes_per_machine / world
    optim = optimizer_state_bytes(optimizer_for_rung(optimizer, offload_optimizer != "none"))
    work = working_bytes(precision)
    trained = trainable_params if adapters else params
    assumptions: list[str] = []
    if backend == "deepspeed":
        optimizer_bytes = trained * (FP32_MASTER_BYTES + optim)
        if adapters:
            weights = 2 * trained * work                          # module states + adapter_model, adapters only
        elif zero_stage == 3:
            weights = params * work if gather_16bit else 0
            if not gather_16bit:
                assumptions.append("ZeRO-3 without the 16-bit gather: save_model writes no weights")
        else:
            weights = 2 * params * work                           # mp_rank_00 module + model.safetensors
        sharded, rank0 = optimizer_bytes, weights
        layout = f"DeepSpeed ZeRO-{zero_stage}: optimizer partitioned over {world} ranks, weights on rank 0"
    elif backend == "fsdp":
        optimizer_bytes = trained * optim
        full = "FULL" in str(fsdp_state_dict_type).upper()
        if full:
            weights = 2 * trained * FP32_MASTER_BYTES if not adapters else trained * FP32_MASTER_BYTES
            sharded, rank0 = 0, weights + optimizer_bytes
            layout = "FSDP full state dict: everything on rank 0"
        else:
            weights = trained * FP32_MASTER_BYTES
            sharded, rank0 = weights + optimizer_bytes, 0
            layout = f"FSDP sharded (torch.distributed.checkpoint): 1/{world} per rank"
            assumptions.append(f"FSDP state_dict_type {fsdp_state_dict_type}")
    else:
        optimizer_bytes = trained * optim
        weights = trained * FP32_MASTER_BYTES
        sharded, rank0 = 0, weights + optimizer_bytes
        layout = "one copy on rank 0"
    small = SMALL_FILES + SMALL_FILES_PER_RANK * world
    one = weights + optimizer_bytes + small
    per_node = int(sharded * per_node_share) + rank0 + SMALL_FILES + SMALL_FILES_PER_RANK * processes_per_machine
    if save_total_limit:
        keep = save_total_limit + 1
    else:
        keep = UNLIMITED_KEEP
        assumptions.append("save_total_limit unset: the Trainer keeps every checkpoint; sized for the last one and "
                           "the one being written (--save-total-limit N sizes N + 1)")
    if adapters:
        export = trained * FP32_MASTER_BYTES
    elif backend == "fsdp" and "FULL" not in str(fsdp_state_dict_type).upper():
        export = params * FP32_MASTER_BYTES                       # the merged fp32 weights (merge_fsdp_weights)
    else:
        export = params * (work if backend == "deepspeed" else FP32_MASTER_BYTES)
    return CheckpointSize(
        bytes=int(one), per_node_bytes=int(per_node), keep=keep, total_bytes=int(one * keep + export),
        per_node_total_bytes=int(per_node * keep + export), save_total_limit=save_total_limit,
        parts={"weights": int(weights), "optimizer": int(optimizer_bytes), "scheduler and RNG": int(small)},
        export_bytes=int(export), layout=layout, assumptions=assumptions)
