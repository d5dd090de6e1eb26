"""The in-process probe of a `wizard tune` trial: per optimizer step, wall time, tokens and peak memory.

Loaded by launch/_worker.py in every rank when WIZARD_PROBE is set (JSON: {"dir", "warmup", "measure"}),
before the user's script runs; the script is not edited. Nothing here imports torch: the hooks are
registered right after the script's own `import torch` (an import hook), so a script that sets
CUDA_VISIBLE_DEVICES or threads before importing torch keeps working.

What is a step. torch's global optimizer-step hooks (register_optimizer_step_post_hook) fire for every
torch.optim.Optimizer subclass, which is what DeepSpeed (ZeRO-1/2/3, DeepSpeedCPUAdam with offload), FSDP,
DDP and a peft model all step in the end. But one optimizer step of the training may step the inner
optimizer several times (ZeRO-1/2 once per parameter group, ZeRO-3 once per sub-group) and DeepSpeed steps
it once with zero gradients at set-up. So a step is counted by its boundaries: a step begins at the model's
first forward after an optimizer step, and the optimizer steps seen since the previous boundary (at least
one, after at least one forward) make it a step. Its wall time runs from boundary to boundary (data
loading, forwards, backward, every inner step, the loop's own work), after a device synchronize.

Tokens: the input_ids (or first integer tensor) handed to the outermost module's forward, summed over the
step's micro-batches; that is exactly what the model computed on, padding included, for any data
pipeline. The outermost module is the first one whose forward runs (DDP, DeepSpeedEngine, FSDP, a
PeftModel or the model itself); the global forward hook that finds it is removed at once.

Memory: torch.cuda's max reserved / allocated and NVML's figure for this process when there is a GPU;
peak RSS (getrusage) always.

After warm-up + measured steps it ends the rank at the next step boundary (no collective is in flight
there; every rank reaches it at the same point): a barrier, a {"done": true} record, then os._exit(0),
before the script's own saving. The supervisor sees a run that ended well, and the done record tells it
apart from a script that ended by itself.

A Hugging Face TrainingArguments built in a trial gets its output_dir moved into the trial directory, so
a checkpoint or log the Trainer writes there never lands in the script's own output directory. It also gets
the trial's micro-batch, gradient accumulation and gradient checkpointing (WIZARD_TRIAL_MICRO_BATCH,
WIZARD_TRIAL_GRAD_ACCUM, WIZARD_TRIAL_GC, set by `wizard tune` from the answers its config was generated
with) before its own __post_init__ runs, so DeepSpeed's HF integration fills the config's "auto" batch
values from them and checks its numbers against them. Each TrainingArguments built records what the script
asked for and what was applied ({"training_args": ...}): a script that never builds one ran its own split,
and tune says a variant is not applicable to it instead of measuring it as if it were.
"""

from __future__ import annotations

import json
import os
import sys
import time

ENV = "WIZARD_PROBE"
FILE_PREFIX = "rank-"
# What a trial runs, for a script that builds HF TrainingArguments (unset: the script's own values).
ENV_MICRO_BATCH = "WIZARD_TRIAL_MICRO_BATCH"
ENV_GRAD_ACCUM = "WIZARD_TRIAL_GRAD_ACCUM"
ENV_GC = "WIZARD_TRIAL_GC"              # "1" on, "0" off


def probe_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"{FILE_PREFIX}{rank}.jsonl")


def trial_done(environ=None) -> int | None:
    """For the supervisor: the steps every rank's probe recorded before ending its rank (the run is a
    finished trial, not a failure and not the script's own end); None outside a trial or when a rank did not."""
    spec = (environ if environ is not None else os.environ).get(ENV)
    if not spec:
        return None
    try:
        directory = json.loads(spec)["dir"]
        steps = []
        for name in sorted(os.listdir(directory)):
            if name.startswith(FILE_PREFIX) and name.endswith(".jsonl"):
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    done = [json.loads(line) for line in f if '"done"' in line]
                steps.append(done[-1]["steps"] if done else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return min(steps) if steps and None not in steps else None


class Probe:
    def __init__(self, directory: str, warmup: int, measure: int, rank: int):
        self.directory = directory
        self.target = warmup + measure
        self.warmup = warmup
        self.rank = rank
        os.makedirs(directory, exist_ok=True)
        self.out = open(probe_file(directory, rank), "a", buffering=1, encoding="utf-8")
        self.steps = 0
        self.started: float | None = None
        self.forwards = 0
        self.tokens: int | None = 0
        self.inner_steps = 0
        self.optimizers: set[str] = set()
        self.torch = None
        self.nvml = None
        self._root_hook = None

    # ---------------------------------------------------------------- torch hooks

    def hook_torch(self, torch) -> None:
        self.torch = torch
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(self.on_optimizer_step)
        self._root_hook = register_module_forward_pre_hook(self._find_root)
        self._write({"event": "start", "rank": self.rank, "pid": os.getpid(), "t": time.time()})

    def _find_root(self, module, args):
        self._root_hook.remove()
        module.register_forward_pre_hook(self.on_forward, with_kwargs=True)
        self.root = type(module).__name__
        self.on_forward(module, args, {})

    def on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self.forwards:            # DeepSpeed's set-up step with zero gradients comes before any forward
            self.inner_steps += 1
            self.optimizers.add(type(optimizer).__name__)

    def on_forward(self, module, args, kwargs):
        if self.inner_steps:
            self._close_step()
        if self.started is None:
            self._synchronize()
            self.started = time.perf_counter()
        self.forwards += 1
        n = _tokens(self.torch, args, kwargs)
        self.tokens = None if n is None or self.tokens is None else self.tokens + n
        return None

    # ---------------------------------------------------------------- steps

    def _close_step(self) -> None:
        self._synchronize()
        now = time.perf_counter()
        self.steps += 1
        record = {"step": self.steps, "rank": self.rank, "warmup": self.steps <= self.warmup,
                  "seconds": now - (self.started or now), "micro_batches": self.forwards, "tokens": self.tokens,
                  "optimizer_steps": self.inner_steps, "optimizers": sorted(self.optimizers),
                  "root": getattr(self, "root", None), **self._memory()}
        self._write(record)
        self.started = now
        self.forwards = 0
        self.tokens = 0
        self.inner_steps = 0
        self.optimizers = set()
        if self.steps >= self.target:
            self._finish()

    def _finish(self) -> None:
        try:
            dist = self.torch.distributed
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                dist.barrier()       # every rank has closed the same step: none is left in a collective
        except Exception as exc:
            self._write({"event": "barrier_failed", "error": f"{type(exc).__name__}: {exc}"})
        self._write({"done": True, "rank": self.rank, "steps": self.steps, "t": time.time()})
        self.out.close()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(0)             # before the script's own saving; no interpreter teardown (gloo threads)

    def _synchronize(self) -> None:
        torch = self.torch
        try:
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception:
            pass

    def _memory(self) -> dict:
        import resource
        m: dict = {"rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        torch = self.torch
        try:
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                m["cuda_max_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
                m["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
                m["cuda_device"] = int(torch.cuda.current_device())
                nv = self._nvml_used(m["cuda_device"])
                if nv is not None:
                    m["nvml_process_bytes"] = nv
        except Exception:
            pass
        return m

    def _nvml_used(self, device: int) -> int | None:
        """This process's memory on its GPU as NVML sees it (context and allocator slack included)."""
        try:
            import pynvml
            if self.nvml is None:
                pynvml.nvmlInit()
                self.nvml = pynvml
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            index = int(visible.split(",")[device]) if visible and visible.split(",")[device].isdigit() else device
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == os.getpid() and p.usedGpuMemory is not None:
                    return int(p.usedGpuMemory)
        except Exception:
            return None
        return None

    def _write(self, record: dict) -> None:
        try:
            self.out.write(json.dumps(record) + "\n")
        except (OSError, ValueError):
            pass


def _tokens(torch, args, kwargs) -> int | None:
    ids = kwargs.get("input_ids") if kwargs else None
    if ids is None:
        for a in list(args) + list((kwargs or {}).values()):
            if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dim() >= 1:
                ids = a
                break
    if ids is None or not isinstance(ids, torch.Tensor):
        return None
    return int(ids.numel())


def trial_overrides(environ=None) -> dict:
    """The TrainingArguments values a trial asks for, from its environment ({} outside a variant)."""
    env = environ if environ is not None else os.environ
    out: dict = {}
    for key, name in ((ENV_MICRO_BATCH, "per_device_train_batch_size"),
                      (ENV_GRAD_ACCUM, "gradient_accumulation_steps")):
        value = env.get(key)
        if value and value.strip().isdigit() and int(value) > 0:
            out[name] = int(value)
    if env.get(ENV_GC, "").strip() in ("0", "1"):
        out["gradient_checkpointing"] = env[ENV_GC].strip() == "1"
    return out


def _checkpointing_fields(cls) -> list[str]:
    """transformers 5 names it activation_checkpointing (gradient_checkpointing is its deprecated alias, which
    __post_init__ copies over only while the new name is unset): set both where both exist."""
    fields = getattr(cls, "__dataclass_fields__", {})
    return [n for n in ("activation_checkpointing", "gradient_checkpointing") if n in fields]


def _patch_training_args(directory: str, overrides: dict, record):
    """TrainingArguments(output_dir=...) in a trial writes into the trial directory instead, and runs the
    trial's micro-batch, accumulation and gradient checkpointing; `record` gets what was asked and applied."""
    def patch(module) -> None:
        cls = module.TrainingArguments
        original = cls.__post_init__
        checkpointing = _checkpointing_fields(cls)

        def __post_init__(self, *a, **kw):
            own_gc = next((getattr(self, n) for n in checkpointing if getattr(self, n, None) is not None), None)
            own = {"per_device_train_batch_size": getattr(self, "per_device_train_batch_size", None),
                   "gradient_accumulation_steps": getattr(self, "gradient_accumulation_steps", None),
                   "gradient_checkpointing": own_gc}
            for name, value in overrides.items():
                if name == "gradient_checkpointing":
                    for field_name in checkpointing:
                        setattr(self, field_name, value)
                else:
                    setattr(self, name, value)
            own_dir = self.output_dir
            self.output_dir = os.path.join(directory, "output_dir")
            logging_dir = getattr(self, "logging_dir", None)
            if logging_dir and own_dir and os.path.abspath(logging_dir).startswith(os.path.abspath(own_dir)):
                self.logging_dir = None
            original(self, *a, **kw)
            now_gc = next((getattr(self, n) for n in checkpointing if getattr(self, n, None) is not None), None)
            record({"training_args": True, "applied": bool(overrides), "own": own, "set": dict(overrides),
                    "now": {"per_device_train_batch_size": getattr(self, "per_device_train_batch_size", None),
                            "gradient_accumulation_steps": getattr(self, "gradient_accumulation_steps", None),
                            "gradient_checkpointing": now_gc}})

        cls.__post_init__ = __post_init__
    return patch


def install() -> Probe | None:
    """Called by _worker.py before the script runs: hooks torch and transformers when they get imported."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    import _hooks                       # beside this file: the worker's sys.path[0] is launch/
    cfg = json.loads(spec)
    rank = int(os.environ.get("RANK", "0"))
    probe = Probe(cfg["dir"], int(cfg.get("warmup", 1)), int(cfg.get("measure", 3)), rank)
    _hooks.when_imported("torch", probe.hook_torch)
    _hooks.when_imported("transformers.training_args",
                         _patch_training_args(cfg["dir"], trial_overrides(), probe._write))
    return probe
