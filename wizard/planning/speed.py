"""The speed model: step time, tokens/s and MFU of one rung of the ladder.

Pure arithmetic over the model's shape, the machine and the strategy; no torch. A step is

    step = grad_accum x (compute + exposed communication + offload traffic + overhead of one micro-step)
           + what happens once per optimizer step (optimizer update, DDP's all-reduce, ZeRO-1/2's
             parameter all-gather, CPU Adam and the parameter upload of offload)

Every figure below is either sourced or marked GUESS / CALIBRATED; `bench/bench_speed_model.py`
compares the result with published measurements (bench/results/speed-model.md).

Sources:
- Training FLOPs per token: 6 N for the matmuls (forward 2 N, backward 4 N; Kaplan et al. 2020,
  arXiv:2001.08361, 2.1) plus 12 L h s for attention scores and their product with V, without the
  causal discount (Chowdhery et al. 2022, PaLM, arXiv:2204.02311, appendix B: the MFU definition used
  by most published figures). Full activation recomputation adds one forward: 8 N + 16 L h s
  (Korthikanti et al. 2022, arXiv:2205.05198, 5: "hardware FLOPs").
- Collectives: ring algorithms move 2 (W-1)/W x S bytes per GPU for an all-reduce and (W-1)/W x S
  for an all-gather or reduce-scatter; nccl-tests' "bus bandwidth" is defined so that time = that
  factor x S / busbw (NVIDIA nccl-tests doc/PERFORMANCE.md).
- Per-strategy volumes: DDP all-reduces the fp32 gradients of AMP once per optimizer step
  (accelerate's `no_sync` during accumulation) and overlaps it with backward (Li et al. 2020,
  arXiv:2006.15704); ZeRO-1/2 reduce(-scatter) the 16-bit gradients and all-gather the updated 16-bit
  weights, ZeRO-3 and FSDP all-gather the weights in forward and again in backward and reduce-scatter
  the gradients: 1.5x DDP's volume (Rajbhandari et al. 2019, arXiv:1910.02054, 7.2-7.3). DeepSpeed
  ZeRO-2 reduces every micro-step (stage_1_and_2.py reduces in the backward hooks whatever the
  accumulation boundary), stage 1 only at the boundary.
- Offload: ZeRO-Offload moves the 16-bit gradients to the host every micro-step and the updated
  16-bit weights back after the CPU step (Ren et al. 2021, arXiv:2101.06840, 4.1); ZeRO-3 parameter
  offload fetches every partition from the host for forward and for backward; NVMe offload swaps the
  fp32 optimizer states (16 B/param) in and out every step (Rajbhandari et al. 2021, ZeRO-Infinity).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from wizard.probe import catalogue

GB = 1e9
TFLOP = 1e12

BOUNDS = ("compute", "communication", "offload")

# --- Achievable efficiency (CALIBRATED on the fit half of bench/data/published_speed.json) ----------
#
# Every value below was chosen on the sources marked "split": "fit" only (llm-foundry, chenyaofo-gist,
# hf-perf-train-gpu-one, torchtune-readme); the held-out sources only measure the result
# (bench/results/speed-model.md reports both). Each comment names the fit rows that set it.

# Fraction of the dense tensor peak that large transformer matmuls reach in a Hugging Face / DeepSpeed /
# FSDP training step on each generation, before the size and batch factors below.
# ampere 0.50 -> 0.60: llm-foundry's A100 rows (mpt-7b/13b/30b-*-8xA100-80GB, 7b-64xA100-40GB: measured MFU
#   51-64 %) were 6-24 % under-predicted at 0.50 once the size factor no longer lifts h >= 5120 models.
# hopper 0.40 -> 0.42: llm-foundry's H100 rows, the same way (median error 0 % at 0.42; 0.40 left -1.4 % and
#   a 2.6-point worse fit median).
# volta 0.45 -> 0.20: hf-perf-train-gpu-one's fp16 rows (bert-large on one V100: 18.64 samples/s at
#   micro-batch 4 = 15 % MFU; mb1/ga4/gc 10.09 samples/s): Volta's tensor cores are so much faster than the
#   rest of an eager fp16 step (layer norms, GELU, softmax, dropout, casts) that the step reaches a fifth of
#   the tensor peak; 0.45 predicted fp16 5.5x faster than fp32 where the doc measured 2.1x.
# turing, ada, blackwell: unchanged (no fit-half row on them but torchtune's RTX 4090 rows, whose 3083 tok/s
#   for LoRA with recomputation would be 93 % of the 4090's 165 TFLOPs bf16 peak: not physically reachable,
#   so not fitted; see speed-model.md).
GENERATION_EFFICIENCY = {"volta": 0.20, "turing": 0.40, "ampere": 0.60, "ada": 0.45, "hopper": 0.42,
                         "blackwell": 0.35}
# Plain fp32 SIMT matmuls reach most of their (8x lower) peak. 0.60 -> 0.80: hf-perf-train-gpu-one's fp32 rows
# (bert-large on one V100, 8.86 samples/s at micro-batch 4 = 57 % MFU, 7.75 at mb1/ga4, 5.99 with
# checkpointing) were 47-63 % under-predicted at 0.60 with the old knees, 1-7 % at 0.80 with the new ones.
FP32_EFFICIENCY = 0.80
EAGER_ATTENTION_EFFICIENCY = 0.5  # eager softmax/score kernels are memory-bound: GUESS (relative)

# Narrow layers and short micro-batches leave the GPU under-occupied: efficiency x h / (h + H0) and
# x T / (T + T0), normalised to 1 at h = 4096 and T = 4096 tokens, capped at 1.1 (CALIBRATED shape).
# HIDDEN_KNEE 1024 -> 256 and TOKENS_KNEE 512 -> 128: with 1024 / 512 the fit half's narrow models were far too
# slow (llm-foundry mpt-125m-s2048-8xA100-80GB -35 %, mpt-350m-s8192-8xA100-80GB -37 %; hf-perf-train-gpu-one
# bert-large, h = 1024: -47 % at mb4) and micro-batch 1 was 38 % slower than micro-batch 4 where the doc
# measured 12.5 % (7.75 against 8.86 samples/s); at 256 / 128 (with the fp32 efficiency below) those rows are
# within -7..+8 % and mb1 is 19 % slower. The fit median was flat (11.6-13.0 %) for TOKENS_KNEE 64-256 and rose
# to 16 % at HIDDEN_KNEE 128.
HIDDEN_KNEE = 256
TOKENS_KNEE = 128
FACTOR_CAP = 1.1

# Overlap of communication with compute (GUESS, per backend's scheduling): DDP overlaps its bucketed
# all-reduce with backward; DeepSpeed ZeRO-2 with overlap_comm the gradient reduction with backward;
# ZeRO-3's prefetch hides part of its gathers behind forward and backward; FSDP2's implicit prefetch
# hides more of them.
OVERLAP = {"ddp": 0.8, "zero12": 0.8, "zero3": 0.6, "fsdp": 0.8}

# Host work per micro-step that no GPU figure covers (kernel launches, Python, the data loader): GUESS.
STEP_OVERHEAD_S = 0.004
LAYER_OVERHEAD_S = 0.00025
# DeepSpeed's engine per optimizer step (gradient norm and overflow check, bookkeeping) and its copy of every
# 16-bit gradient into the contiguous reduction buckets each micro-step (read + write): GUESS for the former,
# stage_1_and_2.py / stage3.py (contiguous_gradients) for the latter.
DEEPSPEED_STEP_OVERHEAD_S = 0.01
# ZeRO-3 / FSDP resharding run Python hooks per module per pass: GUESS.
SHARDED_LAYER_OVERHEAD_S = {"zero3": 0.0015, "fsdp": 0.0005}
# ZeRO-3 fetches parameters per submodule that holds them (partitioned_param_coordinator.fetch_sub_module: one
# all-gather and one hook pair per such module), so its per-layer cost above is for a plain decoder layer's
# PARAM_MODULES_PER_LAYER (q, k, v, o, gate, up, down and two norms). A LoRA adapter adds two such modules per
# adapted Linear (lora_A and lora_B beside the base layer), each fetched on its own. FSDP2 gathers a wrapped
# decoder layer, adapters included, in one all-gather, so adapters add nothing to its per-layer cost.
PARAM_MODULES_PER_LAYER = 9

# LoRA's adapter path is a chain of memory-bound elementwise kernels the FLOP count does not see: per adapted
# Linear, peft (tuners/lora/layer.py Linear.forward) casts the input to the adapters' dtype, applies the dropout,
# runs lora_A and lora_B, scales and adds the result, and backward undoes each (the dropout mask, the casts, the
# gradient of the shared input accumulated); the bytes scale with the adapted modules' input plus output widths,
# which a LoRA adapter's parameters give exactly: trainable / rank = sum of (in + out) features. Bytes per such
# element per forward pass (backward counted as two), CALIBRATED on the fit half of the GPU session
# (bench/results/gpu-2026-12-04.json: Llama-3.1-8B, all-linear r16, dropout 0.05, GC on, one H200): the single-GPU
# trials at micro-batch 4, 8 and 29 took 16 us per token more than the matmuls (1.134 s against 0.972 predicted
# at 4, linear in the tokens), the ZeRO-2 trial 9 us (1.066 against 0.982 s); 4.5 leaves them at -4..+3 %.
# One figure for both although torch AMP keeps peft's adapters in fp32 (its casts cost more) and DeepSpeed runs
# them in bf16: the one ZeRO-2 trial (steps 1.05-1.24 s) does not separate the two from noise, and a split would
# make ZeRO-2 beat one plain GPU for LoRA by less than the 3 % `wizard tune` itself calls a tie on these trials.
ADAPTER_BYTES_PER_ELEMENT = 4.5

# Bytes an optimizer update reads and writes per parameter on the GPU (fp32 master, gradient, two
# Adam moments read; master and moments written; 16-bit copy written), at 70 % of HBM bandwidth.
OPTIMIZER_BYTES_PER_PARAM = 30
DEQUANT_BYTES_PER_PARAM = 4.5
HBM_EFFICIENCY = 0.7

# DeepSpeed CPU optimizer offload: the optimizer step on the host is bound by host memory bandwidth, not by
# arithmetic. Bytes it moves per parameter of the process's partition, read from DeepSpeed 0.19.8's ZeRO-1/2
# offload step (stage_1_and_2.py step): unscale_and_clip_grads multiplies the fp32 gradient partition in place
# (read + write 8 B; gradient_clipping "auto" is the Trainer's max_grad_norm 1.0, so it clips whenever the norm
# exceeds 1), DeepSpeedCPUAdam reads the fp32 weight, gradient and both moments and writes the weight and moments
# (csrc/adam/cpu_adam_impl.cpp: 4 x 4 + 3 x 4 = 28 B), and the updated weights are cast into the pinned 16-bit
# buffer that goes back to the GPU (read 4 + write 2 = 6 B): 42 B. ZeRO-3's offload step (stage3.py
# _optimizer_step, _reassign_or_swap_out_partitioned_parameters) does the same work per sub-group.
# Replaces CPU_ADAM_PARAMS_PER_CORE = 2.8e6 (fitted on the chenyaofo gist's offload rows, whose extra 18-22 s per
# step has another cause: 36x too slow on the H200 of shared/gpu/2026-12-04).
CPU_STEP_BYTES_PER_PARAM = 42
# What one thread of the step streams (DeepSpeedCPUAdam and torch's CPU kernels run on OpenMP's threads).
# CALIBRATED on the fit half of the GPU session bench/results/gpu-2026-12-04.json: its only offload trial,
# tune-offload/01-zero2-offload-opt (Qwen2.5-1.5B, ZeRO-2 + CPU optimizer offload, one H200, one process on 16
# cores: 0.968 s per step, of which the CPU step is what the model's other parts leave, 0.61 s for 1.54e9
# parameters at 42 B: 6.7 GB/s per thread). Held out: DeepSpeed's own core-binding blog
# (bench/data/published_speed.json, deepspeed-corebinding-blog).
CPU_STEP_THREAD_BYTES_PER_S = 6.7e9
# The host's memory bandwidth caps all the processes of a machine together: the peak DRAM bandwidth of the
# class's reference server (GB/s, channels x transfer rate x 8 B), of which the offload step reaches
# HOST_OFFLOAD_EFFICIENCY:
# - hopper: DGX H100 / H200, 2 x Xeon Platinum 8480C, 8 channels DDR5-4800 each (DGX H100/H200 User Guide,
#   "Hardware Overview"): 614 GB/s;
# - blackwell: DGX B200, 2 x Xeon Platinum 8570, 8 channels DDR5-5600 each (DGX B200 User Guide): 717 GB/s;
# - ampere: DGX A100, 2 x AMD EPYC 7742, 8 channels DDR4-3200 each (DGX A100 User Guide): 410 GB/s;
# - volta: DGX-1 with V100, 2 x Xeon E5-2698 v4, 4 channels DDR4-2400 each (DGX-1 datasheet): 154 GB/s.
# Any other server: GUESS, one socket of 8 channels DDR4-3200 (205 GB/s); a workstation or consumer GPU's host:
# GUESS, two channels of DDR5-5600 (90 GB/s).
HOST_MEMORY_GBPS = {"hopper": 614.4, "blackwell": 716.8, "ampere": 409.6, "volta": 153.6}
OTHER_SERVER_HOST_MEMORY_GBPS = 204.8
DESKTOP_HOST_MEMORY_GBPS = 89.6
# The share of that peak the offload step gets with every core of the machine on it: CALIBRATED (fit half) on
# DeepSpeed's ZenFlow write-up (blogs/deepspeed-zenflow/README.md: "For Llama-2-7B with 4x A100, the CPU path can
# take longer than 4s", the path being the CPU step and the 16-bit weights' return): 4 processes x 1.68e9
# parameters x 42 B in at least 3.86 s (4 s less 3.4 GB of weights at 24 GB/s) is at most 73 GB/s, 0.18 of a DGX
# A100's 410 GB/s; the bound is taken. Far below STREAM's 70-80 %: an effective figure that takes in what the model does not (NUMA placement
# of the pinned buffers, OpenMP's barriers between DeepSpeedCPUAdam's tiles). Held out, it gives DeepSpeed's own
# core-binding blog (2x A100, bench/data/published_speed.json deepspeed-corebinding-blog) and DeepSpeed issue
# #6834 (Qwen-72B, ZeRO-3 offload on 4 x 8 A100: "~0.2s vs ~10s" per step; the model: 10.3 s of CPU step).
# The H200 session's one process on 16 cores is below it (16 x 6.7 GB/s = 107 GB/s < 0.18 x 614 GB/s).
HOST_OFFLOAD_EFFICIENCY = 0.18
# Bytes per parameter crossing the PCIe link each micro-step of ZeRO offload: the boundary's fp32 gradient
# partition (stage_1_and_2.py async_inplace_copy_grad_to_fp32_buffer_from_gpu casts to fp32 on the GPU and copies
# 4 B down); a micro-step inside accumulation sends the 16-bit gradient down and, after the first, brings the
# accumulated one back (async_accumulate_grad_in_cpu_via_gpu: 2 + 2 B). Both are issued from the gradient hooks
# as backward proceeds, so they hide behind it (OFFLOAD_OVERLAP of the backward, GUESS).
OFFLOAD_GRAD_BYTES_PER_PARAM = 4
OFFLOAD_OVERLAP = 0.5

# Links when nothing better is known (GB/s, effective).
PCIE_P2P_BUSBW = {3: 10, 4: 20, 5: 40}        # GPU-to-GPU with P2P over a PCIe switch
PCIE_HOST_BUSBW = {3: 6, 4: 10, 5: 20}        # without P2P (RTX 40xx): through host memory
HOST_LINK = {3: 12, 4: 24, 5: 48}             # one GPU's pinned-memory copies to/from the host
# Network between machines, Gb/s per GPU of a server class (all its NICs together, as NCCL's rails use them):
# - DGX/HGX H100, H200 and B200 (and H800): 8 x 400 Gb/s ConnectX-7, one per GPU (NVIDIA DGX H100/H200 User
#   Guide, "Hardware Overview": 8 single-port ConnectX-7 VPI, up to 400 Gb/s; DGX B200 datasheet: the same);
# - DGX/HGX A100 (and A800): 8 x 200 Gb/s HDR ConnectX-6 (DGX A100 User Guide, "Hardware Overview");
# - DGX-1 V100: 4 x 100 Gb/s EDR for 8 GPUs, i.e. 50 Gb/s per GPU (DGX-1 with V100 datasheet).
# Any other server (PCIe data-centre cards, workstation and consumer GPUs): one 100 Gb/s NIC per machine, e.g.
# AWS g5.48xlarge (8 x A10G) "100 Gbps" (EC2 accelerated-computing instance specifications). A GUESS for an
# unknown cluster: `--inter-node-gbps` / `--assume ...,net=` say what yours has. The ring's bus bandwidth between
# machines is taken as that line rate (GB/s = Gb/s / 8).
INTER_NODE_GBPS_PER_GPU = {"hopper": 400, "blackwell": 400, "ampere": 200, "volta": 50}
OTHER_INTER_NODE_GBPS = 100
DEFAULT_NVME_GBPS = 3                         # one local NVMe drive, mixed reads and writes: GUESS
CPU_FLOPS_PER_CORE = 50e9                     # fp32 with AVX2 FMA at ~3 GHz, achievable: GUESS
CPU_GLOO_BUSBW = 2 * GB                       # gloo over loopback TCP: GUESS


@dataclass(frozen=True)
class Machine:
    """What one process runs on, and the links between processes."""

    name: str
    peak_flops: float                  # dense peak for the training dtype, FLOP/s per process
    efficiency: float                  # generation x dtype factor (before size/batch factors)
    hbm_bytes_per_s: float
    intra_busbw: float                 # bytes/s, collectives inside one machine
    inter_busbw: float                 # bytes/s, per machine between machines
    host_link: float                   # bytes/s per process to host memory
    nvme_bytes_per_s: float            # per machine
    cpu_cores_per_process: float
    assumptions: tuple[str, ...] = ()
    inter_node_gbps: float = 0.0       # what inter_busbw was made from, Gb/s per machine (shown to the user)
    inter_node_source: str = ""        # where that figure comes from, in words
    cpu_step_threads: float = 0.0      # OpenMP threads of the host optimizer step per process (0: one per core)
    host_memory_bytes_per_s: float = 0.0   # what the offload step reaches per machine (0: no cap)
    processes_per_machine: int = 1

    @property
    def threads(self) -> float:
        return self.cpu_step_threads or self.cpu_cores_per_process

    @property
    def cpu_step_bytes_per_s(self) -> float:
        """Host memory bandwidth one process's optimizer step gets: its threads', within its share of the
        machine's."""
        own = self.threads * CPU_STEP_THREAD_BYTES_PER_S
        if self.host_memory_bytes_per_s:
            return min(own, self.host_memory_bytes_per_s / max(self.processes_per_machine, 1))
        return own


@dataclass(frozen=True)
class Workload:
    """One micro-step's work: the model's shape and the training options."""

    matmul_params: int                 # parameters in matmuls a token passes through (MoE: active ones)
    params: int                        # all parameters (communication and optimizer sizes)
    layers: int
    hidden: int
    seq: int
    micro_batch: int
    grad_accum: int
    precision: str
    flash: bool
    gradient_checkpointing: bool
    trainable_params: int | None = None  # None: all (full fine-tuning)
    dequant_params: int = 0            # QLoRA: 4-bit weights dequantised for every pass that reads them
    weight_bytes: int | None = None    # bytes of all weights as gathered (QLoRA: NF4); None: params x dtype
    adapter_modules: int = 0           # LoRA / QLoRA: Linear modules given an adapter, whole model
    adapter_io_elements: int = 0       # LoRA / QLoRA: sum of the adapted modules' input + output features
    seq_shards: int = 1                # context / sequence parallelism: GPUs each sequence is split over
    kv_width: int = 0                  # kv_heads x head_dim: what ring attention passes per token and layer
    ulysses: bool = False              # the split is Ulysses' (all-to-alls), not ring attention's
    q_width: int = 0                   # heads x head_dim: the queries and the attention's output per token (Ulysses)
    mlp_params: int = 0                # the MLPs' matmul parameters (TiledMLP runs their forward once more)
    tiled_mlp: bool = False            # DeepSpeed's TiledMLP (ALST)
    checkpoint_offload: bool = False   # ALST's activation checkpoints to host RAM and back every micro-step

    @property
    def tokens(self) -> int:
        """The tokens one GPU runs per micro-step: its 1/seq_shards of each sequence."""
        return self.seq * self.micro_batch // self.seq_shards

    @property
    def trained(self) -> int:
        return self.params if self.trainable_params is None else self.trainable_params


@dataclass(frozen=True)
class Layout:
    """The strategy as the speed model sees it."""

    backend: str                       # single | ddp | deepspeed | fsdp
    zero_stage: int | None
    offload_optimizer: str             # none | cpu | nvme
    offload_param: str
    fsdp_reshard: bool | None
    per_machine: int
    machines: int
    replicate: bool = False            # HSDP: FSDP within each machine, the machines' replicas all-reduce gradients

    @property
    def world(self) -> int:
        return self.per_machine * self.machines

    @property
    def shard_world(self) -> int:
        """The processes the model states are sharded over: one machine's under HSDP, else all."""
        return self.per_machine if self.replicate else self.world


@dataclass(frozen=True)
class Speed:
    step_seconds: float
    tokens_per_second: float           # whole job
    tokens_per_second_per_gpu: float
    mfu: float                         # model FLOPs utilisation, 0..1
    bound: str                         # compute | communication | offload
    compute_seconds: float             # per optimizer step, each part
    communication_seconds: float       # exposed (not hidden behind compute)
    offload_seconds: float             # exposed
    overhead_seconds: float
    optimizer_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def train_seconds(self, tokens: int) -> float:
        return tokens / self.tokens_per_second


# --- The machine -----------------------------------------------------------------------------

def _gpu_perf(hw) -> tuple[catalogue.GpuPerf, str, str | None]:
    """The slowest GPU's figures (a data-parallel step waits for it), its name, and a note when guessed."""
    best: tuple[catalogue.GpuPerf, str] | None = None
    unknown = []
    for g in hw.gpus:
        spec = catalogue.match_device(g.name, g.memory_total)
        if spec is None:
            unknown.append(g.name)
            continue
        perf = catalogue.performance(spec)
        if best is None or perf.tensor16 < best[0].tensor16:
            best = (perf, spec.name)
    if best is not None and not unknown:
        return best[0], best[1], None
    cc = min((g.compute_capability for g in hw.gpus if g.compute_capability), default=(8, 0))
    fallback = "H100-PCIe-80GB" if cc >= (9, 0) else "A100-PCIe-80GB" if cc == (8, 0) else \
        "A10-24GB" if cc >= (8, 0) else "T4-16GB"
    perf = catalogue.PERFORMANCE[fallback]
    if best is not None and best[0].tensor16 < perf.tensor16:
        return best[0], best[1], None
    names = ", ".join(sorted(set(unknown))) or "unknown GPU"
    return perf, fallback, f"{names} is not in the GPU catalogue: speed assumes {fallback}'s figures."


def _consumer(hw) -> bool:
    for g in hw.gpus:
        spec = catalogue.match_device(g.name, g.memory_total)
        if spec is not None and spec.consumer:
            return True
    return False


def _p2p_ok(hw) -> bool | None:
    if not hw.p2p:
        return None
    return all(v == "OK" for i, row in enumerate(hw.p2p) for j, v in enumerate(row) if i != j)


def inter_node_gbps(hw, given: float | None = None, given_source: str | None = None) -> tuple[float, str]:
    """(Gb/s of network per machine, where the figure comes from): the --inter-node-gbps answer (or a measured
    figure, `given_source` saying which), else the machine's own (--assume ...,net=, a saved probe's
    inter_node_gbps), else the default of its class."""
    if given is not None:
        return float(given), given_source or "--inter-node-gbps"
    own = getattr(hw, "inter_node_gbps", None)
    if own is not None:
        return float(own), "net= of --assume" if hw.source.startswith("assume:") else "the hardware description"
    specs = [catalogue.match_device(g.name, g.memory_total) for g in hw.gpus]
    if specs and all(s is not None and s.nvlink and not s.consumer for s in specs):
        # SXM servers: one NIC per GPU (the slowest generation of the machine decides).
        per_gpu = min(INTER_NODE_GBPS_PER_GPU.get(catalogue.performance(s).generation, 0) for s in specs)
        if per_gpu:
            return float(per_gpu * len(specs)), (f"the default for a server of {len(specs)} x {specs[0].name}: "
                                                 f"a {per_gpu} Gb/s NIC per GPU")
    return float(OTHER_INTER_NODE_GBPS), ("the default for a server without a NIC per GPU: one "
                                          f"{OTHER_INTER_NODE_GBPS} Gb/s NIC")


def env_omp_threads(hw) -> int | None:
    """OMP_NUM_THREADS of the machine's environment as the probe recorded it (hardware.relevant_env: what
    `wizard launch` passes on), a positive integer, else None."""
    raw = str((getattr(hw, "env", None) or {}).get("OMP_NUM_THREADS", "")).strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def cpu_step_threads(cores_per_process: float, per_machine: int, omp_threads: int | None) -> float:
    """OpenMP threads the host optimizer step of one process runs on: min(cores / processes, OMP threads).

    OMP_NUM_THREADS when it is set; otherwise what the launch leaves: torchrun sets OMP_NUM_THREADS=1 for every
    process when there are more than one per machine (torch/distributed/run.py: "Setting OMP_NUM_THREADS
    environment variable for each process to be 1 in default"; accelerate launch runs DeepSpeed through torchrun,
    utils/launch.py prepare_deepspeed_cmd_env sets none), and a single process gets OpenMP's default, every core."""
    if omp_threads is None:
        omp_threads = 1 if per_machine > 1 else None
    if omp_threads is None:
        return cores_per_process
    return float(max(min(omp_threads, cores_per_process), 1))


def host_memory_gbps(hw) -> tuple[float, str]:
    """(peak host DRAM bandwidth of one machine, GB/s; its class in words): HOST_MEMORY_GBPS for the SXM
    servers of a generation, else a PCIe server's or a desktop's GUESS."""
    specs = [catalogue.match_device(g.name, g.memory_total) for g in hw.gpus]
    if specs and all(s is not None for s in specs):
        if all(s.nvlink and not s.consumer for s in specs):
            gen = min((catalogue.performance(s).generation for s in specs),
                      key=lambda g: HOST_MEMORY_GBPS.get(g, 0))
            if gen in HOST_MEMORY_GBPS:
                return HOST_MEMORY_GBPS[gen], f"a {gen} SXM server's host"
        if any(s.kind != "datacenter" for s in specs):
            return DESKTOP_HOST_MEMORY_GBPS, "a workstation's host (two DDR5 channels, a guess)"
    return OTHER_SERVER_HOST_MEMORY_GBPS, "a PCIe server's host (one socket of 8 DDR4 channels, a guess)"


def machine_from_hardware(hw, precision: str, per_machine: int, cpu: bool = False,
                          network_gbps: float | None = None, omp_threads: int | None = None,
                          network_source: str | None = None) -> Machine:
    """The speed-relevant figures of this machine, with what had to be assumed said in `assumptions`.
    `network_gbps`: the user's figure for the network between machines (Gb/s per machine), if given.
    `omp_threads`: OMP_NUM_THREADS as the launch will see it (default: the probe's record of it, env_omp_threads)."""
    notes: list[str] = []
    cores = float(hw.cpu_physical_cores or hw.cpu_cores or 1)
    cores_per_process = max(cores / max(per_machine, 1), 1.0)
    threads = cpu_step_threads(cores_per_process, per_machine,
                               omp_threads if omp_threads is not None else env_omp_threads(hw))
    host_gbps, _ = host_memory_gbps(hw)
    host = dict(cpu_step_threads=threads, host_memory_bytes_per_s=host_gbps * GB * HOST_OFFLOAD_EFFICIENCY,
                processes_per_machine=max(per_machine, 1))
    gbps, source = inter_node_gbps(hw, network_gbps, network_source)
    inter = gbps / 8 * GB
    if cpu:
        notes.append(f"CPU processes: {CPU_FLOPS_PER_CORE / 1e9:.0f} GFLOP/s per core and gloo at "
                     f"{CPU_GLOO_BUSBW / GB:.0f} GB/s are rough guesses; treat these speeds as orders of magnitude.")
        return Machine("CPU", cores_per_process * CPU_FLOPS_PER_CORE, 1.0, 20 * GB, CPU_GLOO_BUSBW, inter,
                       20 * GB, DEFAULT_NVME_GBPS * GB, cores_per_process, tuple(notes), gbps, source, **host)
    perf, name, note = _gpu_perf(hw)
    if note:
        notes.append(note)
    if precision == "fp32":
        peak, eff = perf.fp32 * TFLOP, FP32_EFFICIENCY
    else:
        peak, eff = perf.tensor16 * TFLOP, GENERATION_EFFICIENCY[perf.generation]
    if per_machine > 1:
        if hw.nvlink and perf.nvlink_busbw:
            intra = perf.nvlink_busbw * GB
            link = f"NVLink ({perf.nvlink_busbw:.0f} GB/s bus bandwidth)"
        else:
            p2p = _p2p_ok(hw)
            if p2p is None:
                p2p = not _consumer(hw)
            table = PCIE_P2P_BUSBW if p2p else PCIE_HOST_BUSBW
            intra = table[perf.pcie_gen] * GB
            link = (f"PCIe {perf.pcie_gen}.0 {'with' if p2p else 'without'} P2P "
                    f"({table[perf.pcie_gen]:.0f} GB/s bus bandwidth)")
        notes.append(f"GPUs talk over {link}.")
    else:
        intra = perf.nvlink_busbw * GB if perf.nvlink_busbw else PCIE_P2P_BUSBW[perf.pcie_gen] * GB
    return Machine(name, peak, eff, perf.hbm * GB, intra, inter, HOST_LINK[perf.pcie_gen] * GB,
                   DEFAULT_NVME_GBPS * GB, cores_per_process, tuple(notes), gbps, source, **host)


def inter_node_note(m: Machine) -> str:
    return (f"Machines are joined by {m.inter_node_gbps:g} Gb/s ({m.inter_node_gbps / 8:g} GB/s) of network per "
            f"machine ({m.inter_node_source}; --inter-node-gbps or --assume ...,net= sets it).")


# --- FLOPs and efficiency ----------------------------------------------------------------------

def matmul_params(params: int, hidden: int, vocab: int, tied: bool, layers: int, num_experts: int = 0,
                  experts_per_token: int = 0, expert_intermediate: int | None = None,
                  moe_layers: int | None = None) -> int:
    """Parameters whose matmuls every token runs through: all of them, less the input embedding (a
    lookup, no FLOPs; when tied it is the LM head's matmul and stays), less the experts a token is not
    routed to (gated experts: 3 h f each)."""
    n = params - (0 if tied else vocab * hidden)
    if num_experts and experts_per_token and expert_intermediate:
        idle = (num_experts - min(experts_per_token, num_experts)) * 3 * hidden * expert_intermediate
        n -= idle * (moe_layers if moe_layers is not None else layers)
    return max(n, 1)


def model_flops_per_token(w: Workload) -> float:
    """6 N + 12 L h s: the FLOPs MFU is measured against (PaLM appendix B). With a frozen base (LoRA) the
    weight gradients of the frozen matmuls are not computed: 2 N forward + 2 N input gradients + 2 N x the
    trainable share."""
    trained_share = w.trained / w.params if w.params else 1.0
    return (4.0 + 2.0 * trained_share) * w.matmul_params + 12.0 * w.layers * w.hidden * w.seq


def _size_factor(hidden: int) -> float:
    return min(FACTOR_CAP, (4096 + HIDDEN_KNEE) / 4096 * hidden / (hidden + HIDDEN_KNEE))


def _tokens_factor(tokens: int) -> float:
    return min(FACTOR_CAP, (4096 + TOKENS_KNEE) / 4096 * tokens / (tokens + TOKENS_KNEE))


def efficiency(m: Machine, w: Workload) -> float:
    return m.efficiency * _size_factor(w.hidden) * _tokens_factor(w.tokens)


def compute_seconds(m: Machine, w: Workload) -> tuple[float, float]:
    """(forward + backward time of one micro-step, of which backward) on one GPU.

    Passes over the matmul weights: forward 1, backward 2 (activation and weight gradients), a frozen
    base (LoRA) skips the weight gradients of its frozen matmuls; recomputation adds one forward.
    """
    eff = efficiency(m, w)
    frozen_share = 1.0 - (w.trained / w.params if w.params else 1.0)
    bwd_passes = 2.0 - frozen_share
    fwd_passes = 2.0 if w.gradient_checkpointing else 1.0
    matmul = 2.0 * w.matmul_params * w.tokens
    attention = 4.0 * w.layers * w.hidden * w.seq * w.tokens
    attn_eff = eff * (1.0 if w.flash else EAGER_ATTENTION_EFFICIENCY)
    fwd = fwd_passes * (matmul / (m.peak_flops * eff) + attention / (m.peak_flops * attn_eff))
    bwd = bwd_passes * matmul / (m.peak_flops * eff) + 2.0 * attention / (m.peak_flops * attn_eff)
    if w.adapter_io_elements:
        # peft's adapter path: memory-bound elementwise work per adapted input / output feature and token
        # (ADAPTER_BYTES_PER_ELEMENT), in every forward and recomputed forward, backward counted as two passes.
        per_pass = (ADAPTER_BYTES_PER_ELEMENT * w.adapter_io_elements * w.tokens
                    / (m.hbm_bytes_per_s * HBM_EFFICIENCY))
        fwd += fwd_passes * per_pass
        bwd += 2.0 * per_pass
    if w.tiled_mlp and w.mlp_params:
        # TiledMLP runs the MLP without grad in the forward and again, with grad, in backward: one more forward of
        # the MLPs' matmuls (DeepSpeed's TiledMLP docstring: "the forward occurs twice each iteration. And if you're
        # using activation checkpointing it then occurs trice").
        bwd += 2.0 * w.mlp_params * w.tokens / (m.peak_flops * eff)
    if w.dequant_params:
        # bitsandbytes dequantises each NF4 weight to 16 bits before its matmul, in every forward (and
        # recomputed forward) and for the input gradient in backward: read 0.5 B, write 2 B, read 2 B again,
        # memory-bound (QLoRA paper, 4: NF4 is a storage type, computation is in BF16).
        per_pass = DEQUANT_BYTES_PER_PARAM * w.dequant_params / (m.hbm_bytes_per_s * HBM_EFFICIENCY)
        fwd += fwd_passes * per_pass
        bwd += per_pass
    return fwd + bwd, bwd


# --- Communication and offload -----------------------------------------------------------------

def _busbw(m: Machine, layout: Layout) -> float:
    if layout.machines > 1:
        return min(m.intra_busbw, m.inter_busbw)
    return m.intra_busbw


def collective_seconds(nbytes: float, world: int, busbw: float, all_reduce: bool = False) -> float:
    if world <= 1 or nbytes <= 0:
        return 0.0
    factor = (2.0 if all_reduce else 1.0) * (world - 1) / world
    return factor * nbytes / busbw


def _w(precision: str) -> int:
    return 4 if precision == "fp32" else 2


@dataclass(frozen=True)
class _Parts:
    micro_compute: float
    micro_backward: float
    micro_comm: float                  # exposed, per micro-step
    micro_offload: float               # exposed, per micro-step
    micro_overhead: float
    step_comm: float                   # exposed, once per optimizer step
    step_offload: float
    step_optimizer: float
    step_overhead: float = 0.0


def _zero12_gather(w: Workload, world: int, bw: float) -> float:
    """ZeRO-1/2's all-gather after the optimizer step: each rank's updated 16-bit partition of the *trained*
    parameters (stage_1_and_2.py all-gathers the bit16 groups of the optimizer's parameters). A frozen base
    (LoRA, QLoRA) is not in the optimizer: every rank holds all of it, and nothing of it is gathered."""
    return collective_seconds(_w(w.precision) * w.trained, world, bw)


def _parts(m: Machine, w: Workload, layout: Layout) -> _Parts:
    compute, backward = compute_seconds(m, w)
    world, bw, wb = layout.world, _busbw(m, layout), _w(w.precision)
    trained = w.trained
    weights = wb * w.params if w.weight_bytes is None else w.weight_bytes
    sharded = layout.backend in ("deepspeed", "fsdp") and (layout.zero_stage == 3 or layout.fsdp_reshard)
    overhead = STEP_OVERHEAD_S + LAYER_OVERHEAD_S * w.layers
    micro_comm = step_comm = micro_off = step_off = 0.0
    local_trained = trained / layout.shard_world if layout.backend in ("deepspeed", "fsdp") else trained
    if layout.backend == "ddp":
        # AMP keeps fp32 weights, so the gradients DDP all-reduces are fp32.
        ar = collective_seconds(4.0 * trained, world, bw, all_reduce=True)
        step_comm = max(ar - OVERLAP["ddp"] * backward, 0.0)
    elif layout.backend == "deepspeed" and layout.zero_stage in (1, 2):
        reduce = collective_seconds(wb * trained, world, bw)
        if layout.zero_stage == 2:
            micro_comm = max(reduce - OVERLAP["zero12"] * backward, 0.0)
        else:
            step_comm = max(reduce - OVERLAP["zero12"] * backward, 0.0)
        step_comm += _zero12_gather(w, world, bw)
    elif sharded and layout.backend == "deepspeed":
        # ZeRO-3 does what ZeRO-2 does (the same gradient reduce-scatter every micro-step, the same partitioned
        # update) and, instead of ZeRO-2's one all-gather of the updated partitions, gathers every layer's
        # weights (frozen ones too) in forward and again in backward, through per-module hooks. Its exposed
        # communication is at least ZeRO-2's at the same settings: prefetch hides gathers behind compute, but
        # published runs at equal settings are never faster under ZeRO-3 than under ZeRO-2 (DeepSpeed's
        # ZeRO-3 docs; bench/data/published_speed.json), so the model may not predict that either.
        reduce = collective_seconds(wb * trained, world, bw)
        gathers = 2.0 * collective_seconds(weights, world, bw)
        own = w.grad_accum * max(gathers + reduce - OVERLAP["zero3"] * compute, 0.0)
        zero2 = w.grad_accum * max(reduce - OVERLAP["zero12"] * backward, 0.0) + _zero12_gather(w, world, bw)
        step_comm = max(own, zero2)
        adapter_fetches = 2 * w.adapter_modules / PARAM_MODULES_PER_LAYER   # in plain layers' worth
        overhead += SHARDED_LAYER_OVERHEAD_S["zero3"] * (w.layers + adapter_fetches)
    elif sharded and layout.replicate and layout.machines > 1:
        # HSDP: the all-gathers and reduce-scatters inside the machine, then each shard's gradient all-reduced with
        # the other machines' replicas of it (every GPU of a machine at once, sharing its network).
        gathers = 2.0 * collective_seconds(weights, layout.per_machine, m.intra_busbw)
        reduce = collective_seconds(wb * trained, layout.per_machine, m.intra_busbw)
        across = collective_seconds(wb * trained, layout.machines, m.inter_busbw, all_reduce=True)
        micro_comm = max(gathers + reduce + across - OVERLAP["fsdp"] * compute, 0.0)
        overhead += SHARDED_LAYER_OVERHEAD_S["fsdp"] * w.layers
    elif sharded:
        gathers = 2.0 * collective_seconds(weights, world, bw)
        reduce = collective_seconds(wb * trained, world, bw)
        micro_comm = max(gathers + reduce - OVERLAP["fsdp"] * compute, 0.0)
        if world > 1:
            overhead += SHARDED_LAYER_OVERHEAD_S["fsdp"] * w.layers
    elif layout.backend == "fsdp":
        gather = collective_seconds(weights, world, bw)
        reduce = collective_seconds(wb * trained, world, bw)
        micro_comm = max(gather + reduce - OVERLAP["fsdp"] * compute, 0.0)
    if w.seq_shards > 1:
        micro_comm += ulysses_seconds(m, w, layout) if w.ulysses else ring_attention_seconds(m, w)

    step_overhead = 0.0
    if layout.backend == "deepspeed":
        step_overhead = DEEPSPEED_STEP_OVERHEAD_S
        overhead += 2.0 * wb * trained / (m.hbm_bytes_per_s * HBM_EFFICIENCY)
    on_cpu = layout.offload_optimizer in ("cpu", "nvme")
    if on_cpu:
        # Gradients to the host every micro-step (issued from the gradient hooks, partly hidden behind backward),
        # the host's optimizer step (memory-bandwidth bound: cpu_step_seconds), and the updated 16-bit weights back
        # to the GPU before the next forward.
        grads = max(OFFLOAD_GRAD_BYTES_PER_PARAM, wb) * local_trained / m.host_link
        micro_off = max(grads - OFFLOAD_OVERLAP * backward, 0.0)
        step_optimizer = cpu_step_seconds(m, local_trained)
        step_off = wb * local_trained / m.host_link
    else:
        step_optimizer = OPTIMIZER_BYTES_PER_PARAM * local_trained / (m.hbm_bytes_per_s * HBM_EFFICIENCY)
    if w.checkpoint_offload:
        micro_off += max(checkpoint_offload_seconds(m, w) - OFFLOAD_OVERLAP * compute, 0.0)
    if layout.offload_param in ("cpu", "nvme"):
        # the weights' own bytes: a QLoRA base crosses the link as 4-bit codes
        micro_off += 2.0 * weights / world / m.host_link
    if "nvme" in (layout.offload_optimizer, layout.offload_param):
        per_machine_params = trained / layout.machines
        step_off += 2.0 * 16 * per_machine_params / m.nvme_bytes_per_s      # fp32 states in and out
        if layout.offload_param == "nvme":
            micro_off += 2.0 * wb * w.params / layout.machines / m.nvme_bytes_per_s
    return _Parts(compute, backward, micro_comm, micro_off, overhead, step_comm, step_off, step_optimizer,
                  step_overhead)


# Context parallelism: the share of the keys' and values' exchange that hides behind the attention it feeds (each
# step of the ring computes on the chunk it holds while the next arrives). GUESS, checked on the published rows
# (bench/data/published_speed.json, the context-parallel ones).
CP_OVERLAP = 0.5


def ring_attention_seconds(m: Machine, w: Workload) -> float:
    """Exposed time of context parallelism's key/value exchange in one micro-step, inside one machine.

    Each layer's attention gathers the other (cp - 1) / cp of the sequence's keys and values (2 x s x b x kv_width
    in the working dtype; allgather and the ring's passes move the same bytes), in every forward (again in the
    recomputation under gradient checkpointing) and twice in backward (the keys and values, then their gradients).
    Hidden behind the attention's own compute up to CP_OVERLAP."""
    cp = w.seq_shards
    if cp <= 1:
        return 0.0
    kv = 2.0 * w.seq * w.micro_batch * w.kv_width * _w(w.precision)
    passes = (2.0 if w.gradient_checkpointing else 1.0) + 2.0
    comm = passes * w.layers * collective_seconds(kv, cp, m.intra_busbw)
    attention = 12.0 * w.layers * w.hidden * w.seq * w.tokens / (m.peak_flops * efficiency(m, w))
    return max(comm - CP_OVERLAP * attention, 0.0)


def ulysses_seconds(m: Machine, w: Workload, layout: Layout) -> float:
    """Ulysses' all-to-alls in one micro-step, per GPU, none of it hidden (ALST 3.2: "communications of the attention
    head projections cannot be overlapped with compute"). Each layer's forward sends (sp - 1)/sp of its local
    queries, keys and values (_combine_local_sequences; keys and values at the replicated width when sp > kv heads)
    and of the attention's output (_partition_global_sequence); backward sends their gradients, and gradient
    checkpointing's recomputation the forward's again. Inside a machine at its bus bandwidth; a group wider than a
    machine sends the share bound for other machines through the machine's network, shared by its GPUs."""
    sp = w.seq_shards
    if sp <= 1:
        return 0.0
    passes = (2.0 if w.gradient_checkpointing else 1.0) + 1.0
    per_layer = _w(w.precision) * w.tokens * (2.0 * w.q_width + 2.0 * w.kv_width)
    sent = passes * w.layers * per_layer * (sp - 1) / sp
    per_machine = max(layout.per_machine, 1)
    if sp <= per_machine or layout.machines <= 1:
        return sent / m.intra_busbw
    outside = (sp - per_machine) / (sp - 1)
    return max(sent * (1 - outside) / m.intra_busbw, sent * outside * per_machine / m.inter_busbw)


def checkpoint_offload_seconds(m: Machine, w: Workload) -> float:
    """ALST's activation-checkpoint offload in one micro-step: every layer's input to host RAM in the forward and back
    in the backward, over the GPU's host link (w x tokens x h x L each way)."""
    return 2.0 * _w(w.precision) * w.tokens * w.hidden * w.layers / m.host_link


def network_bytes_per_step(w: Workload, layout: Layout) -> float:
    """Bytes each machine sends over the network between machines in one optimizer step (0 on one machine): what
    the slow link carries, for the sharded rungs the multi-machine comparison names. Full sharding (ZeRO-3, FSDP2
    resharding over every process): two all-gathers of the weights and a reduce-scatter of the gradients per
    micro-step, each (W-1)/W of the bytes through every machine's network; HSDP: one all-reduce of the gradients
    across the M replicas, 2 (M-1)/M of them (the convention collective_seconds uses with the machine's bandwidth)."""
    if layout.machines <= 1:
        return 0.0
    wb = _w(w.precision)
    weights = wb * w.params if w.weight_bytes is None else w.weight_bytes
    grads = wb * w.trained
    if layout.backend == "fsdp" and layout.replicate:
        per_micro = 2.0 * (layout.machines - 1) / layout.machines * grads
    else:
        gathers = 2.0 if (layout.zero_stage == 3 or layout.fsdp_reshard) else 1.0
        per_micro = (layout.world - 1) / layout.world * (gathers * weights + grads)
    return per_micro * w.grad_accum


def cpu_step_seconds(m: Machine, params: float) -> float:
    """The host optimizer step of `params` parameters (one process's partition): CPU_STEP_BYTES_PER_PARAM
    through the memory bandwidth the process gets (Machine.cpu_step_bytes_per_s)."""
    return CPU_STEP_BYTES_PER_PARAM * params / m.cpu_step_bytes_per_s


def estimate(m: Machine, w: Workload, layout: Layout) -> Speed:
    """Step time, throughput and MFU of one rung."""
    p = _parts(m, w, layout)
    ga = w.grad_accum
    compute = ga * p.micro_compute
    comm = ga * p.micro_comm + p.step_comm
    offload = ga * p.micro_offload + p.step_offload + (p.step_optimizer if layout.offload_optimizer != "none" else 0)
    optimizer = p.step_optimizer
    overhead = ga * p.micro_overhead + p.step_overhead
    step = compute + comm + ga * p.micro_offload + p.step_offload + optimizer + overhead
    tokens = w.tokens * ga * layout.world
    tps = tokens / step
    mfu = model_flops_per_token(w) * tps / (layout.world * m.peak_flops)
    shares = {"compute": compute, "communication": comm, "offload": offload}
    bound = max(BOUNDS, key=lambda k: shares[k])
    return Speed(step_seconds=step, tokens_per_second=tps, tokens_per_second_per_gpu=tps / layout.world,
                 mfu=mfu, bound=bound, compute_seconds=compute, communication_seconds=comm,
                 offload_seconds=ga * p.micro_offload + p.step_offload, overhead_seconds=overhead,
                 optimizer_seconds=optimizer)


def fmt_rate(tokens_per_second: float) -> str:
    """12,345 -> '12.3k tok/s'."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if tokens_per_second >= scale:
            return f"{tokens_per_second / scale:.3g}{unit} tok/s"
    return f"{tokens_per_second:.3g} tok/s"


def relative(speed: Speed, reference: Speed) -> str:
    """'3.1x slower' / '1.4x faster' / 'as fast' of `speed` against `reference`."""
    if not (speed.tokens_per_second > 0 and reference.tokens_per_second > 0):   # also NaN: no ratio to state
        return "not comparable"
    ratio = reference.tokens_per_second / speed.tokens_per_second
    if not math.isfinite(ratio):
        return "not comparable"
    if 0.97 <= ratio <= 1.03:
        return "about as fast"
    digits = 2 if max(ratio, 1 / ratio) < 1.1 else 1
    if ratio > 1:
        return f"{ratio:.{digits}f}x slower"
    return f"{1 / ratio:.{digits}f}x faster"
