"""A user's own training script, as `wizard tune` meets it on a GPU: a real model shape (config.json, random
weights, nothing downloaded), synthetic tokens, the HF Trainer under whichever accelerate config is active.

Copied from shared/gpu/2026-12-04/train_real.py (the script of that session's `wizard tune` rows), unchanged
but for the sys.path line below; bench/gpu/tune_check.py runs `wizard tune -- bench/gpu/train_real.py ...`.

--method full | lora | qlora; LoRA via peft (all-linear by default), QLoRA via bitsandbytes NF4 (the random
model is saved once to --cache and loaded quantised, as from_pretrained would load a hub model).
Prints one PEAK line on rank 0 at the end: torch's max reserved/allocated bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

# Run from bench/gpu, this directory would be sys.path[0]: its modules (report.py, common.py, ...) would shadow
# a library's top-level module of the same name (as in train_one.py).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--gc", default="off")
    p.add_argument("--method", default="full")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lora-targets", default="all-linear")
    p.add_argument("--cache", default="/tmp/qlora-base")
    args = p.parse_args()

    import torch
    from torch.utils.data import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    cuda = torch.cuda.is_available()
    use_ds = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    ds_config = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    gc = args.gc == "on"
    targs = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="train-real-"), max_steps=args.steps,
        per_device_train_batch_size=args.batch_size, learning_rate=1e-5, logging_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        use_cpu=(not cuda and not use_ds), deepspeed=ds_config if (use_ds and ds_config) else None,
        bf16=cuda, gradient_checkpointing=gc,
        gradient_checkpointing_kwargs={"use_reentrant": False} if gc else None, seed=1,
    )
    config = AutoConfig.from_pretrained(args.config)
    config.use_cache = False
    attn = "sdpa"
    stage = 0
    if use_ds and ds_config:
        stage = int(json.load(open(ds_config)).get("zero_optimization", {}).get("stage", 0) or 0)
    import contextlib
    # Random init on the GPU (seconds for 8B) where the model ends up there whole anyway; ZeRO-3 builds it
    # partitioned under the zero.Init that TrainingArguments armed.
    where = torch.device("cuda") if (cuda and stage != 3) else contextlib.nullcontext()
    if args.method == "full":
        with where:
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    elif args.method == "lora":
        with where:
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn,
                                                     torch_dtype=torch.bfloat16 if cuda else torch.float32)
    else:
        from transformers import BitsAndBytesConfig
        if not os.path.exists(os.path.join(args.cache, "config.json")) and int(os.environ.get("RANK", "0")) == 0:
            base = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
            base.save_pretrained(args.cache)
            del base
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_use_double_quant=True,
                               bnb_4bit_quant_storage=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(args.cache, quantization_config=q, torch_dtype=torch.bfloat16,
                                                     attn_implementation=attn)
        from peft import prepare_model_for_kbit_training
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gc)
    if args.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model
        targets = args.lora_targets if args.lora_targets == "all-linear" else args.lora_targets.split(",")
        model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.05,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
        if gc:
            model.enable_input_require_grads()

    vocab = config.vocab_size

    class Synthetic(Dataset):
        def __len__(self):
            return 100_000

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, vocab, (args.seq_len,), generator=g)
            return {"input_ids": ids, "labels": ids.clone()}

    trainer = Trainer(model=model, args=targs, train_dataset=Synthetic())
    trainer.train()
    if cuda and int(os.environ.get("RANK", "0")) == 0:
        print("PEAK " + json.dumps({"max_reserved": torch.cuda.max_memory_reserved(),
                                    "max_allocated": torch.cuda.max_memory_allocated(),
                                    "method": args.method, "seq": args.seq_len, "mb": args.batch_size}), flush=True)
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
