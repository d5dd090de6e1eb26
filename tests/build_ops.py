"""Build the DeepSpeed ops the suite's real trainings load, before pytest starts: `python -m tests.build_ops`.

DeepSpeed JIT-compiles its C++ ops on first use (CPU Adam for the offload rungs, the CPU accelerator's shared-memory
collectives for every DeepSpeed launch): on a 2-core box about a minute each, paid inside whichever test first
launches one while the other tests compete for the cores. That is installing, not testing, so the README's test
command does it here, once per environment, into the folder the suite uses (EXTENSIONS_DIR, which conftest.py sets
for every test and the processes they launch). An op that cannot be built here is reported and left to the suite,
which then builds it on first use as before: this step never fails the command.
"""

from __future__ import annotations

import os
import sys
import time

# One folder per environment: ~/.cache/torch_extensions is shared by every venv on the machine, and two DeepSpeed
# versions rebuilding an op there under a running launch broke it (conftest.py).
EXTENSIONS_DIR = os.path.join(sys.prefix, "torch_extensions")
OPS = ("CPUAdamBuilder", "ShareMemCommBuilder")


def main() -> int:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", EXTENSIONS_DIR)
    try:
        from deepspeed.accelerator import get_accelerator
    except Exception as exc:        # noqa: BLE001 - DeepSpeed missing or broken: the suite says so itself
        print(f"build_ops: DeepSpeed does not import ({type(exc).__name__}: {exc}); nothing built")
        return 0
    for name in OPS:
        t0 = time.monotonic()
        try:
            builder = get_accelerator().create_op_builder(name)
            if builder is None:
                print(f"build_ops: {name}: not an op of the {get_accelerator().device_name()} accelerator")
                continue
            builder.load(verbose=False)
        except Exception as exc:    # noqa: BLE001 - left to the first test that needs it
            print(f"build_ops: {name}: not built ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
            continue
        print(f"build_ops: {builder.NAME} ready in {os.environ['TORCH_EXTENSIONS_DIR']} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
