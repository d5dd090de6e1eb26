"""Checkpoints: what a checkpoint directory holds, whether it is complete, and its conversions.

Low in the house, beside probe: it reads a directory and calls the libraries' own converters, so `wizard
checkpoint` and `wizard launch --resume` both use it.

- layout.py: inspect one directory (DeepSpeed ZeRO stage and world size, FSDP sharded or full, a plain
  transformers save, LoRA adapters, accelerate's save_state; step, dtype, size, completeness), and find the
  checkpoints under an output directory and the last complete one. Reads file names, headers and JSON; the one
  torch.load is of DeepSpeed's model-states file, with weights_only=True.
- convert.py: DeepSpeed's universal format (deepspeed.checkpoint.ds_to_universal), an export to a safetensors model
  that from_pretrained loads (DeepSpeed's zero_to_fp32, accelerate's merge_fsdp_weights, peft's merge_and_unload),
  and what a resume on another layout needs. Every write goes to a temporary directory renamed into place.
"""
