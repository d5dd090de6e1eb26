"""What is installed and what is missing, and which measurements a missing piece stops."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from typing import Any

LIBRARIES = ("torch", "transformers", "accelerate", "deepspeed", "peft", "bitsandbytes", "nvidia-ml-py", "psutil",
             "PyYAML")
MODULES = {"torch": "torch", "transformers": "transformers", "accelerate": "accelerate", "deepspeed": "deepspeed",
           "peft": "peft", "bitsandbytes": "bitsandbytes", "nvidia-ml-py": "pynvml", "psutil": "psutil",
           "PyYAML": "yaml"}


def environment(dry_run: bool) -> dict[str, Any]:
    """What is installed, whether torch sees CUDA (asked in a subprocess: no CUDA context here)."""
    libs = {}
    for dist in LIBRARIES:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
        importable = importlib.util.find_spec(MODULES[dist]) is not None
        libs[dist] = {"version": version, "importable": importable}
    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable, "libraries": libs,
                            "nvidia_smi": shutil.which("nvidia-smi"), "host": socket.gethostname(),
                            "cpu_count": os.cpu_count(),
                            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    torch_cuda = None
    if libs["torch"]["importable"]:
        code = ("import json, torch\nok = torch.cuda.is_available()\n"
                "devs = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())] if ok else []\n"
                "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'available': ok, "
                "'count': len(devs), 'bf16': ok and torch.cuda.is_bf16_supported(), "
                "'devices': [{'name': d.name, 'total_memory': d.total_memory, 'capability': [d.major, d.minor]} "
                "for d in devs]}))")
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            torch_cuda = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else \
                {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
        except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            torch_cuda = {"error": f"{type(exc).__name__}: {exc}"}
    info["torch_cuda"] = torch_cuda
    # DeepSpeed, peft and bitsandbytes run in a dry run too (DeepSpeed's CPU accelerator, bitsandbytes' CPU
    # backend); NVML, CUDA and nvidia-smi only matter on the GPU.
    missing = [d for d in ("torch", "transformers", "accelerate", "deepspeed", "peft", "bitsandbytes")
               if not libs[d]["importable"]]
    if not dry_run:
        missing += [d for d in ("nvidia-ml-py",) if not libs[d]["importable"]]
        if libs["torch"]["importable"] and not (torch_cuda or {}).get("available"):
            missing.append("CUDA for torch (torch.cuda.is_available() is False)")
        if not info["nvidia_smi"]:
            missing.append("nvidia-smi")
    info["missing"] = missing
    return info


def blocking(missing: list[str], what: str, method: str = "full", alst: str = "") -> list[str]:
    """Which of the missing things stop one measurement. Every training needs torch with CUDA,
    transformers and accelerate; ZeRO cases and ALST's techniques (DeepSpeed's code) need DeepSpeed; LoRA needs
    peft, QLoRA peft and bitsandbytes, the QLoRA loading premise bitsandbytes; the launch comparison needs
    nvidia-smi. Without nvidia-ml-py a case still runs (its peak then lacks the CUDA context, and says so)."""
    needed = [m for m in missing if m in ("torch", "transformers", "accelerate") or m.startswith("CUDA")]
    if what.startswith("zero") or alst not in ("", "none"):
        needed += [m for m in missing if m == "deepspeed"]
    if method in ("lora", "qlora"):
        needed += [m for m in missing if m == "peft"]
    if method == "qlora" or what == "qlora-load":
        needed += [m for m in missing if m == "bitsandbytes"]
    if what == "launch":
        needed += [m for m in missing if m == "nvidia-smi"]
    return needed
