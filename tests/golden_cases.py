"""The golden matrix: hardware x model x options -> the exact files the wizard writes.

Each case is the argument list of `wizard --non-interactive` (without --output-dir, added by the test).
`<FIX>` is replaced by tests/fixtures, `<NVME>` by a scratch directory standing in for an NVMe mount.
Regenerate after an intended change with:  python tests/regen_golden.py
"""

from __future__ import annotations

CASES: dict[str, list[str]] = {
    # A one-GPU workstation with a small model: no distributed training at all.
    "1x4090-llama-tiny": ["--assume", "1xRTX4090", "--model", "<FIX>/models/llama-tiny"],
    # The common 8x80 GB box with a 7B model.
    "8xa100-80-7b": ["--assume", "8xA100-80GB", "--params", "7B"],
    "8xh100-80-8b-file": ["--assume", "8xH100-80GB", "--model", "<FIX>/models/llama-3.1-8b"],
    "8xh100-80-70b": ["--assume", "8xH100-80GB,ram=2T", "--model", "<FIX>/models/llama-3-70b"],
    # Consumer GPUs: 4 x 24 GB, no NVLink.
    "4x4090-7b": ["--assume", "4xRTX4090", "--params", "7B"],
    # Two nodes of 8 GPUs; rank 0 here.
    "2node-8xh100-70b": ["--assume", "8xH100-80GB,ram=2T", "--model", "<FIX>/models/llama-3-70b", "--num-machines", "2",
                         "--machine-rank", "0", "--main-process-ip", "10.0.0.1", "--main-process-port", "29500"],
    # A 152k vocabulary: the fp32 logits alone are gigabytes at 4k tokens.
    "4xa100-40-qwen-bigvocab": ["--assume", "4xA100-40GB", "--model", "<FIX>/models/qwen2.5-7b",
                                "--seq-len", "4096"],
    # Only NVMe offload fits: 405B on one node whose RAM holds the gradients but not the optimizer.
    "8xa100-80-405b-nvme": ["--assume", "8xA100-80GB,ram=3T,disk=20T", "--model", "<FIX>/models/llama-3.1-405b",
                            "--nvme-path", "<NVME>"],
    # FSDP asked for explicitly.
    "8xa100-80-13b-fsdp": ["--assume", "8xA100-80GB", "--params", "13B", "--backend", "fsdp"],
    # An own Accelerate loop: fewer "auto" values get filled, so concrete ones are written.
    "4xa100-80-7b-accelerate-loop": ["--assume", "4xA100-80GB", "--params", "7B", "--trainer", "accelerate",
                                     "--backend", "deepspeed", "--zero-stage", "3"],
    # V100: no bf16, so fp16.
    "8xv100-32-7b-fp16": ["--assume", "8xV100-32GB", "--params", "7B"],
    # This machine's kind: no GPU, two CPU processes with DeepSpeed ZeRO-3 over gloo.
    "cpu-2proc-zero3": ["--hardware", "<FIX>/hardware/cpu-box.json", "--model", "<FIX>/models/llama-tiny",
                        "--backend", "deepspeed", "--zero-stage", "3", "--num-processes", "2"],
    # Long sequences on one H100: offload plus gradient checkpointing, switched on by the ladder.
    # micro-batch 2: at 4 x 8192 tokens the 128k-vocabulary logits alone leave no rung room on 80 GB since the
    # measured CUDA context and margin (issue 19); the case is about the long sequence, not the batch.
    "1xh100-8b-seq8k": ["--assume", "1xH100-80GB,ram=512G", "--model", "<FIX>/models/llama-3.1-8b", "--seq-len", "8192",
                        "--micro-batch", "2"],
    # LoRA / QLoRA (issue 14): the adapters' states are tiny, the frozen base (16-bit or NF4) is what must fit.
    "1x4090-7b-lora": ["--assume", "1xRTX4090", "--params", "7B", "--method", "lora"],
    "1x4090-8b-qlora": ["--assume", "1xRTX4090", "--model", "<FIX>/models/llama-3.1-8b", "--method", "qlora"],
    "2xa100-80-70b-qlora": ["--assume", "2xA100-80GB", "--model", "<FIX>/models/llama-3-70b", "--method", "qlora"],
    "8xh100-80-70b-lora": ["--assume", "8xH100-80GB,ram=2T", "--model", "<FIX>/models/llama-3-70b", "--method", "lora"],
    # accelerate 1.16's FSDP2 parallelism config: context parallelism 2 leaves a shard size of 4 on 8 GPUs.
    "8xh100-80-8b-fsdp2-cp2": ["--assume", "8xH100-80GB", "--model", "<FIX>/models/llama-3.1-8b", "--backend", "fsdp",
                               "--parallelism-config-cp-size", "2"],
    # fp8 on H100s (planned from elsewhere: the backend is installed there, not necessarily here): torchao under
    # FSDP2, which turns CPU-RAM-efficient loading off; Transformer Engine on one GPU.
    "8xh100-80-8b-fsdp2-fp8": ["--assume", "8xH100-80GB", "--model", "<FIX>/models/llama-3.1-8b", "--backend", "fsdp",
                               "--mixed-precision", "fp8"],
    "1xh100-llama-tiny-fp8-te": ["--assume", "1xH100-80GB", "--model", "<FIX>/models/llama-tiny", "--mixed-precision",
                                 "fp8", "--fp8-backend", "te"],
}
