"""What every part of the GPU bench shares: where it lives, byte units, the dry run's machine."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

MiB = 1024 ** 2
GiB = 1024 ** 3
MARKER = "GPU_BENCH_RESULT "                   # train_one.py's last line: MARKER + its JSON result
DRY_RUN_ASSUME = "1xH200,ram=128G,cpus=16"     # the device machine of the issue: one H200, 128 GiB, 16 cores
DRY_RUN_FAKE_NVML = "1xH200"
