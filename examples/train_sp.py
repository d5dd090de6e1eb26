"""A tiny causal LM trained with the HF Trainer, with or without DeepSpeed Ulysses sequence parallelism (ALST).

Run it under an accelerate config with `distributed_type: DEEPSPEED` and, for sequence parallelism, a
`parallelism_config:` section with `parallelism_config_sp_size: N` and `parallelism_config_sp_backend: deepspeed`.
Random weights (a LlamaConfig: hidden 64, 2 layers, 4 query heads over 2 KV heads, vocab 128, SDPA attention),
synthetic data, no downloads, every number fixed by --seed: two runs that see the same data print the same losses,
up to float reduction order.

Nothing here is specific to sequence parallelism: under `sp_size > 1` accelerate registers DeepSpeed's
UlyssesSPAttentionHF in place of SDPA, the Trainer wraps the data loader with UlyssesSPDataLoaderAdapter (each
rank gets 1/sp_size of every sequence and `shift_labels`) and aggregates the loss over the SP group itself. The
script only has to put `position_ids` in every batch (the adapter refuses a batch without them).

Two things only a CPU needs (bench/results/ulysses-cpu.md): accelerate shards no data under DeepSpeed without a
GPU, so the script gives each rank its own batches as accelerate would (`shard_like_a_gpu`); and the micro-batch is
1 (the adapter leaves a larger one's shards non-contiguous on a CPU, and transformers' loss cannot view them).

The data is read in order (`train_sampling_strategy="sequential"`), so step k sees the same samples whether the
k-th batch comes from one process (sp_size 1) or from rank k % 2 of two (sp_size 2, where the adapter hands every
rank's batch to the whole SP group in turn). The optimizer is plain SGD without gradient clipping: Adam and
clipping would hide a gradient that is off by a constant factor (Adam divides it out), SGD passes it on to the
next step's loss.

Rank 0 prints one line per optimizer step with the loss as the Trainer logged it, in full precision:

    [rank0] SP_LOSS step=3 loss=4.123456789012345

and every rank one line saying how much of the sequence it really held:

    [rank1] SP_SHAPES sp_size=2 world_size=2 seq_len=64 local_seq_len=32
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=1, help="per data loader (per rank); 1 under SP on a CPU")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--output-dir", default=None, help="default: a temporary directory")
    return p.parse_args(argv)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def say(msg: str) -> None:
    sys.stdout.write(f"[rank{rank()}] {msg}\n")     # one write per line: ranks share the launcher's pipe
    sys.stdout.flush()


def sp_size_from_env() -> int:
    """The SP size accelerate launch exported from the YAML's parallelism_config section (1 without one)."""
    if os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "").lower() != "true":
        return 1
    return int(os.environ.get("PARALLELISM_CONFIG_SP_SIZE", "1"))


def sample(i: int, seq_len: int, vocab: int) -> list[int]:
    """Sample i: an arithmetic run of tokens (start and stride from i), learnable, so the loss falls."""
    start, stride = (7 * i) % vocab, 1 + i % 5
    return [(start + j * stride) % vocab for j in range(seq_len)]


def shard_like_a_gpu(data, accelerator, batch_size: int) -> None:
    """Give each rank its own batches where accelerate does not.

    Without CUDA, accelerate's state has no backend under DeepSpeed (PartialState._prepare_backend), so it counts
    num_processes=1 and every rank's loader yields the same batches (shared/reference/deepspeed.md §4.3), while
    DeepSpeed trains over a gloo group of all ranks. UlyssesSPDataLoaderAdapter would then hand the SP group the
    same batch sp_size times in a row. On GPUs accelerate gives rank r the batches r, r + W, r + 2W, ...: this
    does the same here, so that step k trains on global batch k as it would on GPUs.
    """
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if accelerator.num_processes == 1 and world > 1:
        data.world, data.rank, data.batch = world, dist.get_rank(), batch_size


def main(argv=None) -> int:
    args = parse_args(argv)
    say("importing torch and transformers")
    import torch
    from torch.utils.data import Dataset
    from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments,
                              set_seed)

    ds_config = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true" or not ds_config:
        say("this example runs under an accelerate config with distributed_type: DEEPSPEED")
        return 2
    targs = TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="wizard-example-sp-"),
        max_steps=args.steps, per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=1,
        learning_rate=args.lr, optim="sgd", max_grad_norm=0.0, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, train_sampling_strategy="sequential", deepspeed=ds_config,
        bf16=False, seed=args.seed,
    )
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=args.seq_len, attn_implementation="sdpa",
    )
    set_seed(args.seed)
    model = LlamaForCausalLM(config)

    class Synthetic(Dataset):
        """Item i of this rank's loader: global sample i, or, once shard_like_a_gpu has set world > 1, the i % batch-th
        sample of global batch (i // batch) * world + rank."""
        world, rank, batch = 1, 0, 1

        def __len__(self):
            return 1000

        def __getitem__(self, i):
            g = ((i // self.batch) * self.world + self.rank) * self.batch + i % self.batch
            ids = torch.tensor(sample(g, args.seq_len, config.vocab_size))
            return {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(args.seq_len)}

    seen = {}

    def record_shape(module, inputs, kwargs):
        ids = kwargs.get("input_ids", inputs[0] if inputs else None)
        if ids is not None and "local" not in seen:
            seen["local"] = ids.shape[-1]

    model.model.register_forward_pre_hook(record_shape, with_kwargs=True)

    class Report(TrainerCallback):
        def on_step_end(self, targs_, state, control, **kw):
            if state.global_step == 1:
                world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
                say(f"SP_SHAPES sp_size={sp_size_from_env()} world_size={world} seq_len={args.seq_len} "
                    f"local_seq_len={seen.get('local')}")

        def on_log(self, targs_, state, control, logs=None, **kw):
            if rank() == 0 and logs and "loss" in logs:     # under SP on a CPU every rank is "process zero"
                say(f"SP_LOSS step={state.global_step} loss={float(logs['loss'])!r}")

    data = Synthetic()
    trainer = Trainer(model=model, args=targs, train_dataset=data, callbacks=[Report()])
    shard_like_a_gpu(data, trainer.accelerator, args.batch_size)
    say(f"starting: world_size={targs.world_size} sp_size={sp_size_from_env()} steps={args.steps}")
    trainer.train()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()   # see examples/train.py: gloo threads and the interpreter's exit
    say("done")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)    # as examples/train.py: nothing left to do, and a C++ thread may abort the normal teardown
