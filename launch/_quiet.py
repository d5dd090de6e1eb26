"""Library messages nobody using the wizard caused, dropped at their logger (the wizard's process and every rank).

- kernels (Hugging Face's kernel hub client) warns "Skipping publisher trust check for 'kernels-community/...'
  because Hugging Face Hub is in offline mode" whenever bitsandbytes' CPU backend looks its optional gemm kernel
  up offline: the wizard itself sizes models with HF_HUB_OFFLINE=1, and peft / transformers import bitsandbytes
  on their own. It printed before `wizard check`'s, `tune`'s and `launch`'s output and in every rank.
- bitsandbytes then warns "Failed to load CPU gemm_4bit_forward from kernels-community: ..." (it falls back to
  its own CPU kernel).

Only these records are dropped (a filter on the two loggers that emit them, matched on the message's start):
every other message of these libraries, and anything the user's script logs or prints, is untouched. No import
here but logging: the CLI's start-up and launch/_worker.py (before the user's script) call it.
"""

from __future__ import annotations

import logging

# logger name -> the start of the message dropped there (as in kernels 0.19.1, bitsandbytes 0.50.2)
NOISE = {
    "kernels._internals.hf_hub": "Skipping publisher trust check for ",
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community",
}


class _DropNoise(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_library_noise() -> None:
    """Install the filters (once per logger: calling it again adds nothing)."""
    for name, prefix in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise(prefix))
