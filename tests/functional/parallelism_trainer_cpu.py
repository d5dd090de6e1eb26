"""Run under `accelerate launch --config_file <the wizard's FSDP2 YAML with parallelism_config:>`: does the
parallelism config reach the HF Trainer on this machine, and does a step run? A tiny random Llama (SDPA), a few
causal-LM samples, one Trainer step. Rank 0 prints one line:

    PARALLELISM_RESULT {"env": {...}, "state": "...", "parallelism_config": {...} | null, "stepped": bool,
                        "error": "..." | null}

`env` is what `accelerate launch` exported from the YAML (ACCELERATE_USE_PARALLELISM_CONFIG, PARALLELISM_CONFIG_*),
`parallelism_config` what the Trainer's Accelerator built from it, `error` the first exception, verbatim, where the
run stopped (on a machine without GPUs accelerate's state is not FSDP: see tests/functional/fsdp_lora_cpu.py).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    result = {"env": {k: v for k, v in sorted(os.environ.items())
                      if k.startswith("PARALLELISM_CONFIG_") or k in ("ACCELERATE_USE_PARALLELISM_CONFIG",
                                                                      "ACCELERATE_USE_FSDP", "FSDP_VERSION")},
              "state": None, "parallelism_config": None, "stepped": False, "error": None, "stage": "import"}
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

        result["stage"] = "arguments"
        args = TrainingArguments(output_dir=os.environ.get("OUT_DIR", "/tmp/parallelism-run"), max_steps=1,
                                 per_device_train_batch_size=1, report_to=[], save_strategy="no", use_cpu=True,
                                 logging_steps=1, disable_tqdm=True)
        result["stage"] = "model"
        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
        config._attn_implementation = "sdpa"
        model = LlamaForCausalLM(config)
        ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
        data = [{"input_ids": row, "labels": row.clone()} for row in ids]
        result["stage"] = "trainer"
        trainer = Trainer(model=model, args=args, train_dataset=data)
        acc = trainer.accelerator
        result["state"] = str(acc.state.distributed_type)
        pc = getattr(acc, "parallelism_config", None)
        if pc is not None:
            result["parallelism_config"] = {k: getattr(pc, k) for k in ("dp_replicate_size", "dp_shard_size",
                                                                          "tp_size", "cp_size")}
        result["stage"] = "train"
        trainer.train()
        result["stepped"] = True
        result["stage"] = "done"
    except Exception as exc:     # the run's own verdict is the result
        result["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}"
    if int(os.environ.get("RANK", "0")) == 0:
        print("PARALLELISM_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
