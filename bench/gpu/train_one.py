"""One measured training run: a real model shape with random weights, a few HF Trainer steps.

Started by bench/gpu/measure.py, one process per configuration, so that a CUDA out-of-memory
cannot take the driver down and every run starts with an empty GPU. Also run under
`wizard launch` (accelerate launch) for the metrics comparison, with --max-seconds.

The last line of stdout is `GPU_BENCH_RESULT {json}`:
    ok / oom / error, the phase that failed, torch's max_memory_reserved / max_memory_allocated,
    NVML's per-process and device memory (sampled every 20 ms), the non-torch overhead
    (NVML process memory - torch reserved, i.e. CUDA context, cuBLAS/NCCL workspaces) and the
    measured peak = max_memory_reserved + that overhead; the engine that really ran; step times.
Exit status: 0 ok, 3 CUDA out-of-memory, 1 anything else.

The model is built where it would live anyway, so that building it costs seconds, not minutes:
single GPU: fp32 on the GPU (what Trainer's AMP keeps, the planner's 4 B/param weights);
ZeRO-2: bf16 on the GPU (DeepSpeed casts to bf16 anyway, then flattens into its partitions);
ZeRO-3: under TrainingArguments' zero.Init (partitioned as it is built), which is why
TrainingArguments is created before the model. FSDP2 runs under `accelerate launch` with the wizard's
default_config.yaml (measure.py starts it so), which exports the FSDP environment the Trainer reads.

LoRA / QLoRA (--method, --adapter-json: what the wizard's snippet tells the user for that rung, i.e. peft's
LoraConfig, transformers' BitsAndBytesConfig and whether to call prepare_model_for_kbit_training): LoRA builds
the base in bf16 on the GPU (fp32 on a CPU); QLoRA loads a saved checkpoint (--checkpoint) through
from_pretrained with the BitsAndBytesConfig, as from a hub model. Two more modes, no training:
--make-checkpoint DIR saves the model (random weights, bf16) as safetensors; --load-only loads --checkpoint
in NF4 and reports where its bytes are (the QLoRA loading premise; measure.py starts two of them at once
under accelerate's FSDP environment).

--alst TECHNIQUES (measure.py --alst, issue 38): ALST's single-GPU techniques on top, by DeepSpeed's own code
(bench/gpu/alst.py: the tiled fused loss, the tiled MLP, the checkpointed inputs offloaded to CPU), "+"-joined, or
"none" for the series' baseline; gradient checkpointing is then non-reentrant (what the offload hooks into).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback

# Run as a script, this directory is sys.path[0]: its siblings (report.py, common.py, runner.py, ...) would
# then shadow any library's top-level module of the same name once torch and transformers import. This
# script needs none of them.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

MARKER = "GPU_BENCH_RESULT "
EXIT_OK, EXIT_ERROR, EXIT_OOM, EXIT_UNSUPPORTED = 0, 1, 3, 4


class NotOnThisDevice(RuntimeError):
    """The case cannot run as itself here (FSDP on a CPU: accelerate runs the FSDP YAML as plain DDP without an
    accelerator): reported as 'unsupported', never trained as something else."""
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 128, "head_dim": 16, "tie_word_embeddings": False}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True, help="a directory with config.json")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--gc", choices=("on", "off"), default="off", help="gradient checkpointing")
    p.add_argument("--ds-config", default=None, help="DeepSpeed JSON (ZeRO-2/3); without it: plain single GPU")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="shrink the shape to a toy (CPU dry run)")
    p.add_argument("--nvml-index", type=int, default=None, help="NVML index of the GPU (default: CUDA device 0's)")
    p.add_argument("--max-seconds", type=float, default=None, help="stop training after this long (launch mode)")
    p.add_argument("--output-dir", default=None)
    p.add_argument("--method", choices=("full", "lora", "qlora"), default="full")
    p.add_argument("--adapter-json", default=None, help="LoRA/QLoRA: {lora, bnb, kbit_prepared} (cases.Planner)")
    p.add_argument("--checkpoint", default=None, help="QLoRA / --load-only: a saved model to load quantised")
    p.add_argument("--make-checkpoint", default=None, metavar="DIR", help="save the model (bf16) there and exit")
    p.add_argument("--load-only", action="store_true", help="from_pretrained --checkpoint in NF4, report, exit")
    p.add_argument("--expect-fsdp", action="store_true", help="stop (unsupported) unless the Trainer runs FSDP")
    p.add_argument("--alst", default=None, help="ALST techniques joined by '+' (bench/gpu/alst.py), or 'none'")
    return p.parse_args(argv)


def is_oom(exc: BaseException) -> bool:
    """torch.OutOfMemoryError, or an OOM that DeepSpeed / NCCL / cuBLAS re-raised as something else."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ in ("OutOfMemoryError", "CUDAOutOfMemoryError"):
            return True
        text = str(exc).lower()
        if "out of memory" in text or "cublas_status_alloc_failed" in text or "cudaerrormemoryallocation" in text:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class NvmlWatch:
    """pynvml directly (not the wizard's wrapper: this is the independent side), sampled every 20 ms.

    Records the device's used memory before this process touches CUDA (the baseline), the maximum
    device used and the maximum of this process's used memory. In a PID namespace NVML lists host
    pids; then the only listed process is taken as ours (recorded as pid_match).
    """

    def __init__(self, index: int | None, period: float = 0.02, enabled: bool = True):
        self.index = index if index is not None else 0
        self.period = period
        self.reason = None
        self.nvml = None
        self.handle = None
        self.baseline_used = None
        self.max_device_used = None
        self.max_process_used = None
        self.pid_match = None
        self.samples = 0
        self.allow_only_process = True      # False where two of ours share the GPU (--load-only)
        self._stop = threading.Event()
        self._thread = None
        if not enabled:
            self.reason = "CPU run: no NVML"
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self.baseline_used = int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except Exception as exc:  # no driver, no nvidia-ml-py: measure what torch sees only
            self.reason = f"{type(exc).__name__}: {exc}"
            self.nvml = None

    def device_used(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except Exception:
            return None

    def process_used(self) -> int | None:
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception:
            return None
        mine = [p for p in procs if int(p.pid) == os.getpid()]
        if mine:
            self.pid_match = "pid"
        elif len(procs) == 1 and self.allow_only_process:
            mine, self.pid_match = list(procs), "only-process"
        value = getattr(mine[0], "usedGpuMemory", None) if mine else None
        return int(value) if isinstance(value, int) else None

    def _loop(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period)

    def sample(self):
        used = self.device_used()
        if used is not None:
            self.max_device_used = max(used, self.max_device_used or 0)
        proc = self.process_used()
        if proc is not None:
            self.max_process_used = max(proc, self.max_process_used or 0)
        self.samples += 1

    def start(self):
        if self.nvml is not None:
            self._thread = threading.Thread(target=self._loop, name="nvml-watch", daemon=True)
            self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.nvml is not None:
            self.sample()

    def to_json(self) -> dict:
        return {"nvml_reason": self.reason, "nvml_index": self.index, "baseline_device_used": self.baseline_used,
                "max_device_used": self.max_device_used, "max_process_used": self.max_process_used,
                "pid_match": self.pid_match, "nvml_samples": self.samples}


def load_config(model_dir: str, tiny: bool):
    from transformers import AutoConfig
    with open(os.path.join(model_dir, "config.json")) as f:
        data = json.load(f)
    if tiny:
        data.update(TINY)
    data.pop("_doc", None)
    model_type = data.pop("model_type")
    config = AutoConfig.for_model(model_type, **data)
    config.use_cache = False
    return config


def build_model(config, device: str, zero_stage: int | None, base_dtype: str | None = None):
    """The model with random weights, created where training keeps it (see the module doc); a LoRA base
    (base_dtype bf16) stays in bf16, frozen."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": "sdpa"}
    if device != "cuda":
        return AutoModelForCausalLM.from_config(config, **kwargs)
    if zero_stage == 3:
        dtype = torch.bfloat16          # zero.Init (armed by TrainingArguments) partitions on the GPU
        return _from_config(config, dtype, kwargs)
    dtype = torch.bfloat16 if (zero_stage in (1, 2) or base_dtype == "bf16") else torch.float32
    with torch.device("cuda"):
        return _from_config(config, dtype, kwargs)


def _from_config(config, dtype, kwargs):
    from transformers import AutoModelForCausalLM
    try:
        return AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
    except TypeError:                   # transformers < 4.56 names it torch_dtype
        return AutoModelForCausalLM.from_config(config, torch_dtype=dtype, **kwargs)


def read_adapter_setup(path: str | None) -> dict:
    if not path:
        raise ValueError("--method lora/qlora needs --adapter-json")
    with open(path) as f:
        return json.load(f)


def bnb_config(setup: dict):
    """transformers' BitsAndBytesConfig from the wizard's keyword arguments (dtypes by name)."""
    import torch
    from transformers import BitsAndBytesConfig
    kwargs = {k: (getattr(torch, v) if k.endswith(("_dtype", "_storage")) and isinstance(v, str) else v)
              for k, v in (setup.get("bnb") or {}).items()}
    return BitsAndBytesConfig(**kwargs)


def load_quantized(checkpoint: str, setup: dict, cuda: bool):
    """from_pretrained in NF4, as from a hub model: bitsandbytes quantises while loading."""
    import torch
    from transformers import AutoModelForCausalLM
    if not checkpoint or not os.path.exists(os.path.join(checkpoint, "config.json")):
        raise RuntimeError(f"QLoRA needs a saved checkpoint (--checkpoint {checkpoint!r} has no config.json)")
    dtype = torch.bfloat16 if cuda else torch.float32
    try:
        return AutoModelForCausalLM.from_pretrained(checkpoint, quantization_config=bnb_config(setup), dtype=dtype,
                                                    attn_implementation="sdpa")
    except TypeError:                   # transformers < 4.56 names it torch_dtype
        return AutoModelForCausalLM.from_pretrained(checkpoint, quantization_config=bnb_config(setup),
                                                    torch_dtype=dtype, attn_implementation="sdpa")


def with_adapters(model, setup: dict, gc: bool, quantized: bool):
    """peft's adapters exactly as the wizard's snippet adds them."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    if quantized and setup.get("kbit_prepared"):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gc)
    model = get_peft_model(model, LoraConfig(**setup["lora"]))
    if gc:
        model.enable_input_require_grads()      # a frozen embedding's output needs a grad for checkpointing
    return model


def zero_stage_of(ds_config: str | None) -> int | None:
    if not ds_config:
        return None
    with open(ds_config) as f:
        return int(json.load(f).get("zero_optimization", {}).get("stage", 0))


def describe_engine(trainer, model) -> dict:
    engine = getattr(trainer, "model_wrapped", model)
    out = {"engine_class": type(engine).__name__, "model_class": type(model).__name__}
    if hasattr(engine, "zero_optimization_stage"):
        try:
            out["zero_stage"] = int(engine.zero_optimization_stage())
        except Exception:
            pass
    param = next(iter(model.parameters()), None)
    if param is not None:
        out["param_dtype"] = str(getattr(param, "dtype", None))
        out["partitioned"] = hasattr(param, "ds_numel")
    out["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    out["distributed_type"] = str(getattr(state, "distributed_type", None))
    out["fsdp_enabled"] = bool(getattr(trainer, "is_fsdp_enabled", False))
    # FSDP2's fully_shard turns each wrapped module's class into FSDP<Class>
    out["fsdp_modules"] = sum(1 for m in engine.modules() if type(m).__name__.startswith("FSDP")) \
        if hasattr(engine, "modules") else 0
    out["linear4bit_modules"] = sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit")
    optimizer = getattr(trainer, "optimizer", None)
    optimizer = getattr(optimizer, "optimizer", optimizer)     # accelerate's AcceleratedOptimizer wrapper
    out["optimizer_class"] = type(optimizer).__name__
    inner = getattr(optimizer, "optimizer", None)   # DeepSpeed's ZeRO optimizer wraps the one that steps
    out["inner_optimizer_class"] = type(inner).__name__ if inner is not None else None
    return out


def run(args, result: dict, watch: NvmlWatch) -> int:
    import tempfile

    techniques = alst_techniques(args, args.device == "cuda")     # what cannot run here stops before the imports
    result["phase"] = "import"
    import torch
    import transformers
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                          "cuda": getattr(torch.version, "cuda", None)}
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
    stage = zero_stage_of(args.ds_config)
    if args.ds_config:
        import deepspeed
        result["versions"]["deepspeed"] = deepspeed.__version__

    result["phase"] = "training_arguments"
    config = load_config(args.model_dir, args.tiny)
    targs = TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="gpu-bench-"),
        max_steps=args.steps,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=1,
        learning_rate=1e-5,
        warmup_steps=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
        bf16=cuda,
        gradient_checkpointing=args.gc == "on",
        gradient_checkpointing_kwargs={"use_reentrant": False} if args.alst is not None and args.gc == "on" else None,
        deepspeed=args.ds_config,
        use_cpu=not cuda and not args.ds_config,
        seed=1234,
    )
    result["optim"] = str(getattr(targs.optim, "value", targs.optim))

    result["phase"] = "build_model"
    if args.method == "qlora":
        model = with_adapters(load_quantized(args.checkpoint, read_adapter_setup(args.adapter_json), cuda),
                              read_adapter_setup(args.adapter_json), args.gc == "on", quantized=True)
    elif args.method == "lora":
        model = with_adapters(build_model(config, args.device, stage, base_dtype="bf16"),
                              read_adapter_setup(args.adapter_json), args.gc == "on", quantized=False)
    else:
        model = build_model(config, args.device, stage)
    result["params"] = int(sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()))
    result["trainable_params"] = int(sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()
                                         if p.requires_grad))
    vocab = config.vocab_size

    class RandomTokens(Dataset):
        def __len__(self):
            return 1_000_000

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, vocab, (args.seq_len,), generator=g)
            return {"input_ids": ids, "labels": ids.clone()}

    step_times: list[float] = []

    class Clock(TrainerCallback):
        start = None

        def on_step_begin(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()
            if self.start is None:
                self.start = time.monotonic()

        def on_step_end(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            step_times.append(round(time.perf_counter() - self.t0, 4))
            if args.max_seconds and time.monotonic() - self.start > args.max_seconds:
                control.should_training_stop = True

    trainer_cls = Trainer
    if args.alst is not None:
        from bench.gpu import alst
        result["alst"] = {"techniques": list(techniques), "fused_loss_shards": alst.fused_loss_shards(
            args.micro_batch * args.seq_len, vocab) if "fused-loss" in techniques else None,
            "tiled_mlp_shards": alst.tiled_mlp_shards(args.seq_len, config.hidden_size)
            if "tiled-mlp" in techniques else None}
        if "tiled-mlp" in techniques:
            result["alst"]["tiled_mlps"] = alst.tile_mlps(model)
        trainer_cls = alst.trainer_class(techniques)

    result["phase"] = "trainer_init"
    trainer = trainer_cls(model=model, args=targs, train_dataset=RandomTokens(), callbacks=[Clock()])
    if args.expect_fsdp and not getattr(trainer, "is_fsdp_enabled", False):
        state = getattr(getattr(trainer.accelerator, "state", None), "distributed_type", None)
        raise NotOnThisDevice(f"accelerate runs this FSDP config as {state} here (FSDP needs an accelerator: "
                              "accelerate/state.py makes FSDP only of a MULTI_<accelerator> or GPU state)")
    result["phase"] = "train"
    out = trainer.train()
    result["phase"] = "done"
    result["steps_done"] = int(out.global_step)
    result["step_times_s"] = step_times[:10]           # the first steps; a launch run has hundreds
    if len(step_times) > 10:
        ordered = sorted(step_times)
        result["step_time_median_s"] = ordered[len(ordered) // 2]
    result["train_loss"] = float(out.training_loss) if out.training_loss == out.training_loss else None
    result["engine"] = describe_engine(trainer, model)
    if getattr(trainer, "alst_offload_stats", None) is not None:
        result["alst"]["offload_stats"] = trainer.alst_offload_stats
    return EXIT_OK


def alst_techniques(args, cuda: bool) -> tuple[str, ...]:
    """--alst's techniques; what cannot run as itself here is said before anything is built."""
    if args.alst is None:
        return ()
    root = os.path.dirname(os.path.dirname(_HERE))      # bench.gpu.alst, from the checkout (bench/gpu/../..)
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench.gpu import alst
    techniques = alst.parse("" if args.alst == "none" else args.alst)
    if "ckpt-offload" in techniques:
        if args.gc != "on":
            raise ValueError("--alst ckpt-offload offloads what gradient checkpointing keeps: it needs --gc on")
        if not cuda:
            raise NotOnThisDevice("the checkpoint offload moves device memory to the host: on a CPU there is none")
    return techniques


def make_checkpoint(args, result: dict) -> int:
    """The model with random weights saved in bf16 safetensors, as a hub checkpoint would be (QLoRA loads it)."""
    import torch
    result["phase"] = "build_model"
    config = load_config(args.model_dir, args.tiny)
    t0 = time.monotonic()
    if args.device == "cuda":           # random init on the GPU: seconds for 8B, where the CPU takes minutes
        with torch.device("cuda"):
            model = _from_config(config, torch.bfloat16, {"attn_implementation": "sdpa"})
    else:
        model = _from_config(config, torch.bfloat16, {"attn_implementation": "sdpa"})
    result["build_s"] = round(time.monotonic() - t0, 2)
    result["phase"] = "save"
    t0 = time.monotonic()
    model.save_pretrained(args.make_checkpoint)
    result["save_s"] = round(time.monotonic() - t0, 2)
    result["checkpoint_bytes"] = sum(os.path.getsize(os.path.join(args.make_checkpoint, f))
                                     for f in os.listdir(args.make_checkpoint))
    result["params"] = int(sum(p.numel() for p in model.parameters()))
    result["phase"] = "done"
    return EXIT_OK


def held_bytes(model) -> dict[str, int]:
    """Bytes of the model's parameters and buffers by device type (cuda, cpu, meta)."""
    out: dict[str, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        kind = t.device.type
        out[kind] = out.get(kind, 0) + t.numel() * t.element_size()
    return out


def is_fsdp_enabled_now() -> bool | None:
    """transformers' own test for FSDP's RAM-efficient loading (env + process group), wherever this version keeps it."""
    for where in ("transformers.distributed.fsdp", "transformers.integrations.fsdp", "transformers.modeling_utils"):
        try:
            module = __import__(where, fromlist=["is_fsdp_enabled"])
            return bool(module.is_fsdp_enabled())
        except (ImportError, AttributeError):
            continue
    return None


def load_only(args, result: dict, watch: NvmlWatch) -> int:
    """One rank of the QLoRA loading premise: from_pretrained in NF4 under accelerate's FSDP environment (the
    parent exports ACCELERATE_USE_FSDP, FSDP_CPU_RAM_EFFICIENT_LOADING, RANK, LOCAL_RANK, WORLD_SIZE), then
    where the model's bytes are and what this process holds on the GPU, while every rank still holds its own."""
    import torch
    import torch.distributed as dist
    cuda = args.device == "cuda"
    watch.allow_only_process = False
    setup = read_adapter_setup(args.adapter_json)
    result["phase"] = "init_process_group"
    # gloo: the ranks share one GPU here, which NCCL refuses; loading exchanges nothing on the GPU.
    dist.init_process_group("gloo")
    result.update(rank=dist.get_rank(), world_size=dist.get_world_size(),
                  local_rank=int(os.environ.get("LOCAL_RANK", "-1")), fsdp_enabled=is_fsdp_enabled_now())
    import transformers
    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import bitsandbytes
        result["versions"]["bitsandbytes"] = bitsandbytes.__version__
    except ImportError as exc:
        raise RuntimeError(f"bitsandbytes is not installed: {exc}") from exc
    result["phase"] = "from_pretrained"
    t0 = time.monotonic()
    model = load_quantized(args.checkpoint, setup, cuda)
    if cuda:
        torch.cuda.synchronize()
    result["load_s"] = round(time.monotonic() - t0, 2)
    result["held_bytes"] = held_bytes(model)
    result["params"] = int(sum(p.numel() for p in model.parameters()))
    if cuda:
        result["memory_allocated_after_load"] = int(torch.cuda.memory_allocated())
    result["phase"] = "barrier"
    dist.barrier()                      # every rank holds its model now: the GPU's use is the sum
    if watch.nvml is not None:
        result["process_used_after_load"] = watch.process_used()
        result["device_used_after_load"] = watch.device_used()
    dist.barrier()
    dist.destroy_process_group()
    result["phase"] = "done"
    return EXIT_OK


def memory_figures(device: str, watch: NvmlWatch) -> dict:
    """torch's allocator peaks plus NVML's view; the measured peak adds the non-torch overhead."""
    out = {"max_memory_reserved": None, "max_memory_allocated": None, "memory_reserved_now": None,
           "process_used_now": None, "non_torch_bytes": None, "measured_peak_bytes": None, "peak_source": None}
    if device != "cuda":
        return out
    import torch
    try:
        torch.cuda.synchronize()
    except Exception:
        pass
    out["max_memory_reserved"] = int(torch.cuda.max_memory_reserved())
    out["max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
    out["memory_reserved_now"] = int(torch.cuda.memory_reserved())
    if watch.nvml is not None:
        proc = watch.process_used()
        out["process_used_now"] = proc
        if proc is not None:
            out["non_torch_bytes"] = proc - out["memory_reserved_now"]
            out["measured_peak_bytes"] = out["max_memory_reserved"] + out["non_torch_bytes"]
            out["peak_source"] = "max_memory_reserved + (NVML process used - torch reserved)"
        elif watch.baseline_used is not None:
            used = watch.device_used()
            if used is not None:
                out["non_torch_bytes"] = used - watch.baseline_used - out["memory_reserved_now"]
                out["measured_peak_bytes"] = out["max_memory_reserved"] + out["non_torch_bytes"]
                out["peak_source"] = "max_memory_reserved + (NVML device used delta - torch reserved)"
    if out["measured_peak_bytes"] is None:
        out["measured_peak_bytes"] = out["max_memory_reserved"]
        out["peak_source"] = "max_memory_reserved only (no NVML: CUDA context not counted)"
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # The baseline is read here, before torch touches CUDA.
    watch = NvmlWatch(args.nvml_index, enabled=args.device == "cuda")
    result: dict = {"status": "error", "phase": "start", "device": args.device, "seq_len": args.seq_len,
                    "micro_batch": args.micro_batch, "gc": args.gc, "ds_config": args.ds_config,
                    "tiny": args.tiny, "steps": args.steps, "method": args.method,
                    "mode": "make-checkpoint" if args.make_checkpoint else "load-only" if args.load_only else "train"}
    t0 = time.monotonic()
    code = EXIT_ERROR
    watch.start()
    try:
        if args.make_checkpoint:
            code = make_checkpoint(args, result)
        elif args.load_only:
            code = load_only(args, result, watch)
        else:
            code = run(args, result, watch)
        result["status"] = "ok"
    except NotOnThisDevice as exc:
        result["status"] = "unsupported"
        result["error"] = str(exc)
        code = EXIT_UNSUPPORTED
    except BaseException as exc:  # report everything, including KeyboardInterrupt from a timeout's SIGINT
        oom = is_oom(exc)
        result["status"] = "oom" if oom else "error"
        result["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ''}"
        if not oom:
            result["traceback_tail"] = traceback.format_exc().splitlines()[-12:]
        code = EXIT_OOM if oom else EXIT_ERROR
    finally:
        watch.stop()
    try:
        result.update(memory_figures(args.device, watch))
    except Exception as exc:
        result["memory_error"] = f"{type(exc).__name__}: {exc}"
    result.update(watch.to_json())
    result["wall_s"] = round(time.monotonic() - t0, 2)
    print(MARKER + json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: after a CUDA OOM, DeepSpeed's / NCCL's exit hooks can hang, and the
    # result line is already out.
    os._exit(status)
