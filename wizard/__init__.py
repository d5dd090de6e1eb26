"""wizard: plan, configure, launch and watch multi-GPU Hugging Face training.

The core modules (hardware, model, memory, plan, questions, answers, emit, validate, check)
never import a UI toolkit, and never import torch / transformers / deepspeed at module level.
"""

__version__ = "0.1.0"
