"""DeepSpeed's own answer to loading a checkpoint's universal conversion into another ZeRO stage: one process
(gloo, world size 1) builds the tiny Llama of examples/train.py under DeepSpeed with `checkpoint.load_universal`
and the given stage, and calls engine.load_checkpoint(CHECKPOINT) as the Trainer's resume does. Prints one line:

    LOAD_RESULT {"stage": 3, "loaded": false, "error": "AssertionError", "where": "state_dict_factory.py:check_ckpt_list"}

`where` is the innermost frame of the exception: the library's own refusal, not ours.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback


def main() -> int:
    checkpoint, stage = sys.argv[1], int(sys.argv[2])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    deepspeed.init_distributed(dist_backend="gloo")
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    ds_config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                 "zero_optimization": {"stage": stage}, "checkpoint": {"load_universal": True}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                      config=ds_config)
    result = {"stage": stage, "loaded": False, "error": None, "where": None}
    try:
        path, _ = engine.load_checkpoint(checkpoint)
        result["loaded"] = path is not None
    except Exception as exc:       # noqa: BLE001 - the library's refusal is the result
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        result.update(error=type(exc).__name__, where=f"{os.path.basename(frame.filename)}:{frame.name}",
                      message=str(exc)[:300])
    print("LOAD_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
