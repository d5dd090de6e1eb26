"""Size the model from its config (no weights), LoRA/QLoRA adapters, and the memory model."""
