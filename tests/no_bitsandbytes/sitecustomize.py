"""On PYTHONPATH for the training processes the tests launch (tests/launch_support.env): they see no bitsandbytes.

peft imports bitsandbytes whenever it is installed (peft/helpers.py), and transformers' Trainer imports peft; on a
CPU, bitsandbytes' import runs torch.compile, which imports torch._inductor: about a second of CPU per process, in
every rank of every launch (hundreds per run of the suite), and 20-30 s of silence before a rank's first line on a
loaded 2-core box, where the stall tests count 30 s. None of those trainings quantises; the tests that do (QLoRA,
the GPU bench's dry run) do not use this. A None entry in sys.modules is Python's own "not installed":
importlib.util.find_spec returns None (transformers', accelerate's and peft's availability checks) and the import
raises ImportError (peft's try/except).
"""

import sys

sys.modules.setdefault("bitsandbytes", None)
