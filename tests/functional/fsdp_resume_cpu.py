"""Run under `wizard launch` with the wizard's FSDP2 YAML: a plain accelerate training loop that saves FSDP2
checkpoints and resumes from the one `wizard launch --resume` hands it ($WIZARD_RESUME_FROM), on any world size.

A tiny random Llama (the same on every rank: seeded), sharded by accelerate's own fsdp2_prepare_model from the
FullyShardedDataParallelPlugin the YAML exported; AdamW; a constant learning rate. Each step trains the same global
batch of GLOBAL_BATCH samples whatever the world size (rank r of W takes every W-th sample), so a run on 3 ranks
resumed from a 2-rank checkpoint computes the same loss as the 2-rank run would have.

Checkpoints are what accelerate's save_state writes for FSDP with SHARDED_STATE_DICT (save_fsdp_model,
save_fsdp_optimizer: torch.distributed.checkpoint directories pytorch_model_fsdp_0/ and optimizer_0/), into
OUT/checkpoint_<step>; a resume loads them with load_fsdp_model / load_fsdp_optimizer, which read the DCP shards
into this run's own sharding (DCP reshards on load). On a GPU machine accelerator.save_state / load_state call
exactly these; here the accelerator's state is NO (accelerate turns a run into FSDP only on an accelerator, see
tests/functional/fsdp_lora_cpu.py), so the loop calls them itself.

Rank 0 prints `step=<n> loss=<float repr>` per step (the mean over all ranks), and `--fail-at-step S` makes every
rank raise before step S (a run that stops after its checkpoints). Rank 0 writes the model's config.json into the
output directory at the start and the trained weights, whole, as trained.safetensors at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

GLOBAL_BATCH = 12          # divisible by 2, 3 and 4: every rank the same number of samples
SEQ = 32


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-steps", type=int, default=2)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--fail-at-step", type=int, default=None)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import (fsdp2_prepare_model, load_fsdp_model, load_fsdp_optimizer,
                                             save_fsdp_model, save_fsdp_optimizer)
    from transformers import LlamaConfig, LlamaForCausalLM

    accelerator = Accelerator()
    plugin = FullyShardedDataParallelPlugin()         # what the YAML says, as accelerate reads it
    accelerator.state.fsdp_plugin = plugin
    torch.manual_seed(1234)                           # the same model on every rank
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = fsdp2_prepare_model(accelerator, LlamaForCausalLM(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        config.save_pretrained(args.output_dir)       # from_pretrained's config for the export of a sharded save
    start = 0
    resume = os.environ.get("WIZARD_RESUME_FROM")
    if resume:
        load_fsdp_model(plugin, accelerator, model, resume)
        load_fsdp_optimizer(plugin, accelerator, optimizer, model, resume)
        start = int(Path(resume).name.split("_")[-1])
        if rank == 0:
            print(f"resumed from {resume} at step {start} on {world} ranks", flush=True)
    for step in range(start + 1, args.steps + 1):
        if args.fail_at_step is not None and step >= args.fail_at_step:
            raise RuntimeError(f"deliberate failure before step {step} (--fail-at-step)")
        samples = [step * GLOBAL_BATCH + i for i in range(GLOBAL_BATCH)][rank::world]
        ids = torch.tensor([[(s * 7 + j) % 128 for j in range(SEQ)] for s in samples])
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step={step} loss={float(mean) / world!r}", flush=True)
        if step % args.save_steps == 0:
            out = os.path.join(args.output_dir, f"checkpoint_{step}")
            save_fsdp_model(plugin, accelerator, model, out)
            save_fsdp_optimizer(plugin, accelerator, optimizer, model, out)
    # the trained model's weights, whole, for the test to compare an export with (torch's own full state dict)
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(args.output_dir, "trained.safetensors"))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
