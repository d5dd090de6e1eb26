"""Run under `accelerate launch --config_file <the wizard's FSDP YAML>`: LoRA on a tiny random Llama, sharded by
FSDP2 exactly as accelerate shards it for the HF Trainer (accelerate's own FullyShardedDataParallelPlugin, built
from the environment `accelerate launch` exported for the YAML, and accelerate's fsdp2_prepare_model), trained
for a few steps on every rank over gloo.

Why not the Trainer: accelerate 1.15 turns a run into FSDP only when its state is a MULTI_<accelerator> type
(AcceleratorState.__init__ in accelerate/state.py lists MULTI_GPU, MULTI_NPU, ...; not MULTI_CPU), and on a
machine without an accelerator the state is NO (or MULTI_CPU with use_cpu, which gives DDP). So the Trainer
cannot be made to run FSDP on this CPU; the sharding itself (torch's fully_shard over a gloo process group) can,
and that is what this runs. Rank 0 prints one line:

    FSDP_LORA_RESULT {"state": "NO", "fsdp": true, "sharded": 37, "base_identical": true, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lora-rank", type=int, default=4)
    p.add_argument("--lora-alpha", type=int, default=8)
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--lora-targets", default="q_proj,v_proj")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
    from transformers import LlamaConfig, LlamaForCausalLM

    accelerator = Accelerator()
    state = accelerator.distributed_type.value
    plugin = FullyShardedDataParallelPlugin()         # what the YAML says, as accelerate reads it
    accelerator.state.fsdp_plugin = plugin
    torch.manual_seed(1234)                           # the same base on every rank
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(
        r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
        target_modules=args.lora_targets.split(","), bias="none", task_type="CAUSAL_LM"))
    trainable, total = model.get_nb_trainable_parameters()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model = fsdp2_prepare_model(accelerator, model)
    rank, world = dist.get_rank(), dist.get_world_size()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    losses = []
    for _ in range(args.steps):
        ids = torch.tensor([[(i % 16 + j + rank) % 128 for j in range(32)] for i in range(4)])
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    local = {n: p.numel() if not hasattr(p, "to_local") else p.to_local().numel() for n, p in model.named_parameters()}
    after = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone().cpu()
             for n, p in model.named_parameters()}
    if rank == 0:
        base = [n for n in before if "lora_" not in n]
        adapters = [n for n in before if "lora_" in n]
        print("FSDP_LORA_RESULT " + json.dumps({
            "state": state, "fsdp_version": plugin.fsdp_version, "reshard": plugin.reshard_after_forward,
            "offload": isinstance(plugin.cpu_offload, CPUOffloadPolicy), "fsdp": isinstance(model, FSDPModule),
            "world": world, "params": len(before), "sharded": sum(hasattr(p, "full_tensor") for p in model.parameters()),
            "local_elements": sum(local.values()), "total": total, "trainable": trainable,
            "base_identical": all(before[n].equal(after[n]) for n in base), "adapters": len(adapters),
            "adapters_changed": sum(not before[n].equal(after[n]) for n in adapters),
            "first_loss": losses[0], "last_loss": losses[-1]}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # After destroy_process_group a C++ thread can still abort the interpreter's teardown (SIGABRT, "terminate
    # called without an active exception"), failing a run whose result is already printed: skip that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
