"""Where fp8 mixed precision can run: the GPUs and the backend.

accelerate 1.16 trains in fp8 through two backends, `ao` (torchao's Float8Linear) and `te` (NVIDIA Transformer
Engine); MS-AMP, 1.15's third, is gone (FP8BackendType is NO/TE/AO). Both need fp8 tensor cores, compute capability
8.9 or newer (Ada: L4, L40, RTX 40xx; Hopper: H100, H200; Blackwell: B200, ...): torch._scaled_mm, which both call,
refuses older GPUs at the first matmul, and nothing before that (accelerate's launch, its config loader) asks.

Whether a backend is installed is looked up without importing it (importlib.util.find_spec). It matters only for
the machine the wizard runs on: for another machine (`--assume`, `--hardware FILE`) the software there is not
known, so both backends are offered and the written files say which one to install (`wizard check` on the
training machine then reports a missing one). `installed_fp8_backends` is the one place that looks; tests replace it.

Pure and cheap to import: no torch.
"""

from __future__ import annotations

from wizard.config.vocab import FP8_BACKENDS

MIN_COMPUTE_CAPABILITY = (8, 9)
# backend -> the module accelerate imports for it (utils/imports.py is_torchao_available /
# is_transformer_engine_available), and its name for people
MODULES = {"ao": "torchao", "te": "transformer_engine"}
NAMES = {"ao": "torchao", "te": "Transformer Engine"}
PACKAGES = {"ao": "torchao", "te": "transformer-engine[pytorch]"}


def installed_fp8_backends() -> tuple[str, ...]:
    """The fp8 backends importable here, in FP8_BACKENDS order; none is imported."""
    import importlib.util

    found = []
    for backend in FP8_BACKENDS:
        try:
            spec = importlib.util.find_spec(MODULES[backend])
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            found.append(backend)
    return tuple(found)


def is_this_machine(hw) -> bool:
    """The files are for the machine the wizard runs on (its software is the training machine's)."""
    return getattr(hw, "source", "probe") == "probe"


def backends_for(hw) -> tuple[str, ...]:
    """The backends to offer: those installed here when planning for this machine, both for another machine."""
    return installed_fp8_backends() if is_this_machine(hw) else FP8_BACKENDS


def gpu_problem(hw, use_cpu: bool = False) -> str | None:
    """Why these GPUs cannot train in fp8 (one line), or None when every one of them can."""
    if use_cpu or hw is None or not hw.gpus:
        return "fp8 needs GPUs (CPU processes train in fp32)"
    for g in hw.gpus:
        cc = tuple(g.compute_capability) if g.compute_capability else None
        if cc is None or cc < MIN_COMPUTE_CAPABILITY:
            shown = ".".join(map(str, cc)) if cc else "an unknown compute capability"
            return (f"fp8 needs compute capability 8.9+ (L4, L40, H100, H200, B200, ...); GPU {g.index} "
                    f"({g.name}) has {shown}")
    return None


def backend_problem(hw, backend: str | None = None) -> str | None:
    """Why fp8 (with `backend`, or with any backend) cannot be offered here, or None."""
    offered = backends_for(hw)
    if backend is None:
        if offered:
            return None
        return ("fp8 needs torchao or Transformer Engine on this machine, and neither is installed "
                "(pip install torchao)")
    if backend in offered:
        return None
    return f"{NAMES[backend]} ({MODULES[backend]}) is not installed on this machine (pip install {PACKAGES[backend]})"
