"""The memory model: bytes per GPU (and per host) for each strategy of the ladder.

Pure arithmetic over ints and floats; no torch, no deepspeed. Every formula names its source.
Where a figure is a guess rather than a sourced formula, the comment says "GUESS" so that the UI
and the report can say so too.

Notation: P = parameters, LL = parameters of the largest module (DeepSpeed's definition),
N = data-parallel world size, n = processes per machine, s = sequence length, b = micro-batch,
h = hidden size, a = attention heads, L = layers, V = vocabulary, f = MLP intermediate size.

Bytes per parameter in mixed precision with AdamW (the ZeRO paper, Rajbhandari et al. 2019,
arXiv:1910.02054, section 3.1 and Fig. 1): 2 (16-bit weights) + 2 (16-bit gradients) + K = 12
(fp32 master weights 4 + momentum 4 + variance 4) = 16 B/param.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wizard.units import GiB, MiB

# --- Per-parameter byte counts ------------------------------------------------------------------

# Optimizer state bytes per parameter, on top of any fp32 master copy.
# adamw: exp_avg + exp_avg_sq in fp32 = 8 B (ZeRO paper section 3.1; HF model_memory_anatomy.md
#   "AdamW: 8 bytes per param").
# adamw-8bit: two 1-byte states = 2 B (bitsandbytes; HF model_memory_anatomy.md "8-bit AdamW:
#   2 bytes per param"); the per-block quantisation constants are ignored (< 1%).
# sgd: one fp32 momentum buffer = 4 B (HF model_memory_anatomy.md "SGD with momentum: 4 bytes").
# adafactor: GUESS. The factored second moment is O(rows + cols) per matrix, i.e. nearly nothing,
#   but HF's Adafactor keeps an fp32 copy of 16-bit params and, with beta1 set, a full first moment;
#   4 B/param is a deliberately round upper-ish figure, not a measured one.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adamw-8bit": 2, "sgd": 4, "adafactor": 4}
GUESSED_OPTIMIZERS = frozenset({"adafactor"})

FP32_MASTER_BYTES = 4          # the fp32 master weights of mixed-precision training (ZeRO paper 3.1)
FP32_GRAD_BYTES = 4            # DeepSpeed's fp32 gradient partition ("4_grads_32bit" in stage_1_and_2.py)

# DeepSpeed's estimators use this factor for host RAM only (stage_1_and_2.py / stage3.py defaults).
DS_ADDITIONAL_BUFFER_FACTOR = 1.5

# Fragmentation allowance on top of the sum: what the caching allocator reserves beyond the live tensors
# (what nvidia-smi shows beyond max_memory_allocated, less the CUDA context). Megatron-LM's
# theoretical_memory_usage.py multiplies activations by 1.05 "buffer for optimizer and miscellaneous
# temporaries". 0.05 -> 0.07 (CALIBRATED on the fit half of bench/data/published_memory.json): at 0.05 the
# fit half's whole-process peaks reached -10.2 % (hfdoc-bert-large-fp16-mb4-1xV100-16GB-mem), beyond the
# -10 % that an under-prediction may reach before "fits" becomes an OOM; 0.07 is the smallest whole percent
# that keeps every fit-half whole-process row more than a point inside it (-8.7 %).
MARGIN_FRACTION = 0.07

# What a GPU process holds before its first tensor: the CUDA context and the kernels PyTorch loads with it.
# MEASURED in the fit half of bench/data/published_memory.json: hf-perf-train-gpu-one's torch.ones((1, 1)).to("cuda")
# on a V100 shows "GPU memory occupied: 1343 MB" (NVML, MiB): 1343 MiB, where the plan assumed 1 GiB and so
# under-predicted every whole-process (nvidia-smi) peak by 0.3 GiB. Lazy module loading (CUDA >= 11.7,
# CUDA_MODULE_LOADING=LAZY) can make it smaller; the answer "cuda_context" sets it per machine.
CUDA_CONTEXT_BYTES = 1343 * MiB

# Per-process overhead of a CPU (gloo) process standing in for the CUDA context: GUESS
# (torch + Python + DeepSpeed's CPU accelerator import, typically a few hundred MiB RSS).
CPU_PROCESS_OVERHEAD_BYTES = 512 * MiB

# DDP default bucket size (torch.nn.parallel.DistributedDataParallel bucket_cap_mb=25). The buckets
# together hold every gradient, so the size of one bucket does not change the total (see ddp_buffers).
DDP_BUCKET_CAP_BYTES = 25 * MiB


def working_bytes(precision: str) -> int:
    """Bytes of one weight / gradient / activation element in the compute dtype."""
    return 4 if precision == "fp32" else 2


def optimizer_state_bytes(optimizer: str) -> int:
    return OPTIMIZER_STATE_BYTES[optimizer]


def optimizer_for_rung(optimizer: str, offloads_optimizer: bool) -> str:
    """The optimizer that really runs on a DeepSpeed rung, given the one the user asked for.

    With optimizer offload the ds_config makes DeepSpeedCPUAdam run the step (emit.deepspeed_config):
    8-bit AdamW is never paired with CPU offload, so it becomes AdamW with fp32 states (8 B/param,
    DeepSpeed's `fp32_optimizer_states` default). SGD and Adafactor have no DeepSpeed CPU op (only
    Adam/AdamW/Adagrad/Lion do) and are kept as asked. The plan counts this optimizer's states and
    emit writes the matching config: one rule in one place.
    """
    if offloads_optimizer and optimizer == "adamw-8bit":
        return "adamw"
    return optimizer


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model-state tensor for one precision x optimizer."""

    param: int          # working weights: 2 in bf16/fp16, 4 in fp32
    grad: int           # working gradients: same dtype as the weights
    master: int         # fp32 master copy kept by mixed precision (0 in pure fp32 for torch/DDP)
    optim: int          # optimizer states (OPTIMIZER_STATE_BYTES)

    @property
    def k(self) -> int:
        """The ZeRO paper's K: bytes of optimizer-side state per parameter (master + states)."""
        return self.master + self.optim


def state_bytes(precision: str, optimizer: str) -> StateBytes:
    # fp32 training has no 16-bit copy and no separate master: weights are the master (ZeRO paper
    # section 3.1 describes the mixed-precision case; fp32 is K without the 4 B master).
    if precision == "fp32":
        return StateBytes(param=4, grad=4, master=0, optim=optimizer_state_bytes(optimizer))
    return StateBytes(param=2, grad=2, master=FP32_MASTER_BYTES, optim=optimizer_state_bytes(optimizer))


@dataclass(frozen=True)
class ModelStates:
    """Model states (weights, gradients, optimizer) per GPU, plus host RAM and NVMe per machine."""

    parameters: int
    gradients: int
    optimizer: int
    cpu: int = 0        # bytes of host RAM per machine
    nvme: int = 0       # bytes of NVMe per machine

    @property
    def gpu(self) -> int:
        return self.parameters + self.gradients + self.optimizer


# --- DeepSpeed's own estimators, reimplemented to the byte --------------------------------------

def ds_estimate_zero2_model_states_mem_needs(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                                              cpu_offload: bool = True,
                                              additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    """(cpu_bytes, gpu_bytes): deepspeed/runtime/zero/stage_1_and_2.py,
    estimate_zero2_model_states_mem_needs (deepspeed 0.19.8), same operations in the same order so
    that float rounding agrees too."""
    return _zero2(total_params, num_gpus_per_node, num_nodes, cpu_offload, additional_buffer_factor,
                  param16=2, partition=18, cpu_optimizer=16)


def ds_estimate_zero3_model_states_mem_needs(total_params: int, largest_layer_params: int,
                                              num_gpus_per_node: int = 1, num_nodes: int = 1,
                                              cpu_offload: bool = True, cpu_offload_params: bool = True,
                                              zero_init: bool = True,
                                              additional_buffer_factor: float = 1.5) -> tuple[int, int, int]:
    """(cpu_bytes, gpu_bytes, largest_layer_memory): deepspeed/runtime/zero/stage3.py,
    estimate_zero3_model_states_mem_needs (deepspeed 0.19.8), same operations in the same order."""
    return _zero3(total_params, largest_layer_params, num_gpus_per_node, num_nodes, cpu_offload,
                  cpu_offload_params, zero_init, additional_buffer_factor,
                  layer_bytes=4, param16=2, partition=18, cpu_optimizer=16, cpu_all=18)


def _zero2(total_params, num_gpus_per_node, num_nodes, cpu_offload, additional_buffer_factor,
           param16, partition, cpu_optimizer):
    # DeepSpeed's comment: "2 = params_16bit, 18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit
    # + 8_optimizer_states_32bit"; 16 on the CPU = 4 master + 4 fp32 grads + 8 Adam states.
    # param16 / partition / cpu_optimizer generalise 2 / 18 / 16 to other precisions and optimizers.
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = param16 * total_params
        cpu_mem = total_params * max(4 * total_gpus, cpu_optimizer) * additional_buffer_factor
    else:
        gpu_mem = param16 * total_params + int(partition * total_params / total_gpus)
        # 4 * num_gpus_per_node: every local process first builds the model in fp32 (memory.rst).
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def _zero3(total_params, largest_layer_params, num_gpus_per_node, num_nodes, cpu_offload, cpu_offload_params,
           zero_init, additional_buffer_factor, layer_bytes, param16, partition, cpu_optimizer, cpu_all):
    # DeepSpeed memory.rst: the 4 * largest_layer term is "2 bytes fp16 params are gathered and
    # 2 bytes fp16 grads are computed" for the biggest module; gpus_factor = 1 / num_nodes.
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = (layer_bytes * largest_layer_params)
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * cpu_all * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, cpu_all * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(param16 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * cpu_optimizer * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node,
                                             cpu_optimizer * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(partition * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


# --- Model states per strategy --------------------------------------------------------------------

def _ds_multipliers(sb: StateBytes) -> tuple[int, int, int]:
    """(param16, GPU partition bytes, CPU optimizer bytes) for DeepSpeed ZeRO with this precision x optimizer.

    Mixed precision + AdamW gives DeepSpeed's 2 / 18 / 16 exactly. DeepSpeed keeps an fp32 master
    partition even in fp32 training (stage_1_and_2.py clones the partition to
    master_weights_and_grads_dtype; stage3.py _create_fp32_partitions clones too), so the master is
    4 B for every precision here, unlike torch DDP; fp32 makes the "16-bit" weights and gradients
    4 B each (read from the code, not measured).
    """
    master = FP32_MASTER_BYTES
    partition = sb.grad + FP32_GRAD_BYTES + master + sb.optim
    cpu_optimizer = master + FP32_GRAD_BYTES + sb.optim
    return sb.param, partition, cpu_optimizer


def states_single_or_ddp(params: int, precision: str, optimizer: str, num_gpus_per_node: int = 1,
                         additional_buffer_factor: float = DS_ADDITIONAL_BUFFER_FACTOR) -> ModelStates:
    """Single GPU or DDP: every GPU holds everything (ZeRO paper Fig. 1, 'baseline': (2+2+K)P).

    Mixed precision is torch AMP here (what the HF Trainer and Accelerate do without DeepSpeed): the
    weights stay fp32 and act as the master, gradients are fp32, so the split is 4 + 4 + states. The
    total equals the paper's 2 + 2 + (4 + states); only the labels differ. Host RAM: each local
    process first loads the model in fp32, counted as DeepSpeed's ZeRO-2 estimator counts it
    (4 * P * n * 1.5, stage_1_and_2.py).
    """
    sb = state_bytes(precision, optimizer)
    param = grad = 4                      # fp32 weights (AMP's master) and fp32 gradients
    cpu = int(params * 4 * num_gpus_per_node * additional_buffer_factor)
    return ModelStates(parameters=param * params, gradients=grad * params, optimizer=sb.optim * params, cpu=cpu)


def states_zero1(params: int, precision: str, optimizer: str, num_gpus_per_node: int, num_nodes: int,
                 offload_optimizer: bool = False,
                 additional_buffer_factor: float = DS_ADDITIONAL_BUFFER_FACTOR) -> ModelStates:
    """ZeRO-1 (P_os): 2P + 2P + K*P/N (ZeRO paper Fig. 1: '4 + 12/N' bytes per param for Adam).

    DeepSpeed has no ZeRO-1 estimator. With CPU optimizer offload, stage 1 runs the same
    stage_1_and_2.py code as stage 2, so its figures are the ZeRO-2 offload estimator's.
    """
    sb = state_bytes(precision, optimizer)
    if offload_optimizer:
        return states_zero2(params, precision, optimizer, num_gpus_per_node, num_nodes, True, additional_buffer_factor)
    world = num_gpus_per_node * num_nodes
    k = FP32_MASTER_BYTES + sb.optim          # DeepSpeed keeps the fp32 master even in fp32 training
    cpu = int(params * 4 * num_gpus_per_node * additional_buffer_factor)
    return ModelStates(parameters=sb.param * params, gradients=sb.grad * params,
                       optimizer=int(k * params / world), cpu=cpu)


def states_zero2(params: int, precision: str, optimizer: str, num_gpus_per_node: int, num_nodes: int,
                 offload_optimizer: bool = False,
                 additional_buffer_factor: float = DS_ADDITIONAL_BUFFER_FACTOR) -> ModelStates:
    """ZeRO-2: DeepSpeed's estimate_zero2_model_states_mem_needs, exactly for mixed precision + AdamW,
    with the multipliers generalised for other optimizers and fp32 (_ds_multipliers)."""
    sb = state_bytes(precision, optimizer)
    param16, partition, cpu_optimizer = _ds_multipliers(sb)
    cpu, gpu = _zero2(params, num_gpus_per_node, num_nodes, offload_optimizer, additional_buffer_factor,
                      param16, partition, cpu_optimizer)
    world = num_gpus_per_node * num_nodes
    parameters = param16 * params
    if offload_optimizer:
        # The GPU keeps only the 16-bit weights; gradients pass through the IPG buckets (buffers).
        return ModelStates(parameters=parameters, gradients=0, optimizer=gpu - parameters, cpu=cpu)
    gradients = int((sb.grad + FP32_GRAD_BYTES) * params / world)
    return ModelStates(parameters=parameters, gradients=gradients, optimizer=gpu - parameters - gradients, cpu=cpu)


def zero3_gathers(world: int, offload_param: bool) -> bool:
    """Whether ZeRO-3 allocates gathered copies of the parameters it fetches.

    With one process and the partitions on the GPU it does not: partition_parameters.py's all_gather_coalesced
    returns _no_gather_coalesced when every parameter's partition world size is 1, and NoGatherHandle sets
    param.data = param.ds_tensor.data.to(device), the partition itself (the same tensor: it is already on the
    device). Everything else (more than one process, or partitions on the host) gathers into new buffers."""
    return world > 1 or offload_param


def zero3_grad_partition_bytes(precision: str) -> int:
    """Bytes per parameter of ZeRO-3's gradient partition: stage3.py _setup_for_real_optimizer allocates
    grad_partitions_flat_buffer (partition numel) in the gradient-accumulation dtype, which the engine sets to
    the model's dtype when data_types.grad_accum_dtype is unset (engine.py get_data_types): 2 B in bf16 / fp16."""
    return working_bytes(precision)


def states_zero3(params: int, largest_layer_params: int, precision: str, optimizer: str,
                 num_gpus_per_node: int, num_nodes: int, offload_optimizer: bool = False,
                 offload_param: bool = False, zero_init: bool = True,
                 additional_buffer_factor: float = DS_ADDITIONAL_BUFFER_FACTOR) -> ModelStates:
    """ZeRO-3: DeepSpeed's estimate_zero3_model_states_mem_needs, less the two things it counts that stage3.py
    does not hold (both MEASURED on one H200, bench/results/gpu-2026-12-04.md, where the estimator's figure
    over-predicted the whole-process peak by 14-16 %):

    - The fp32 gradient partition. The estimator's "18" is 2 (16-bit weights) + 16 (fp32 weights, gradients,
      momentum, variance; memory.rst), but the gradient partition ZeRO-3 keeps through the step is
      grad_partitions_flat_buffer in the model's dtype (zero3_grad_partition_bytes: 2 B in bf16); the fp32
      gradients exist one optimizer sub-group at a time, during the step, when the activations are gone
      (_prepare_fp32_grad_for_sub_group flattens and casts one sub-group, _release_sub_group frees it):
      zero3_step_bytes, counted against the activations in zero3_buffers. So the gradients are
      grad-dtype * P / N, not (2 + 4) * P / N: 16 B per parameter in bf16 with AdamW, not 18.
    - The gathered copy of the largest layer (half of the estimator's 4 * LL term: "2 bytes fp16 params are
      gathered and 2 bytes fp16 grads are computed") when nothing is gathered: one process, partitions on the
      GPU (zero3_gathers). Elsewhere the gathered weights are counted once, by zero3_buffers' live parameters
      (stage3_max_live_parameters covers every gathered module, the largest included).

    With the two corrections added back the figure is DeepSpeed's estimator (tests/unit/test_memory.py holds
    both: ds_estimate_zero3_model_states_mem_needs to the byte, and this function to it less exactly these terms,
    (4 - w) * P / N and w * LL, w the 16-bit width; in fp32 the partition is fp32 and the first term is 0).
    Offloaded optimizer: the gradient partition lives in host memory, as in the estimator.
    zero_init defaults to True: the HF Trainer builds the model under deepspeed.zero.Init when a ZeRO-3 config is
    active (transformers integrations/deepspeed.py, is_deepspeed_zero3_enabled), and Accelerate does with
    zero3_init_flag. It changes only the host-RAM figure.
    """
    sb = state_bytes(precision, optimizer)
    param16, partition, cpu_optimizer = _ds_multipliers(sb)
    cpu_all = param16 + cpu_optimizer            # 18 = 2 fp16 params + 16 (memory.rst)
    layer_bytes = sb.param + sb.grad             # 4 = 2 gathered params + 2 grads of the largest layer
    if offload_param and not offload_optimizer:
        raise ValueError("DeepSpeed's estimator has no parameter-only offload case")
    cpu, _, _ = _zero3(params, largest_layer_params, num_gpus_per_node, num_nodes, offload_optimizer,
                       offload_param, zero_init, additional_buffer_factor,
                       layer_bytes, param16, partition, cpu_optimizer, cpu_all)
    world = num_gpus_per_node * num_nodes
    layer_params = sb.param * largest_layer_params if zero3_gathers(world, offload_param) else 0
    layer_grads = sb.grad * largest_layer_params
    if offload_optimizer and offload_param:
        return ModelStates(parameters=layer_params, gradients=layer_grads, optimizer=0, cpu=cpu)
    parameters = layer_params + int(param16 * params / world)
    if offload_optimizer:
        return ModelStates(parameters=parameters, gradients=layer_grads, optimizer=0, cpu=cpu)
    gradients = layer_grads + int(zero3_grad_partition_bytes(precision) * params / world)
    optimizer_bytes = int((FP32_MASTER_BYTES + sb.optim) * params / world)
    return ModelStates(parameters=parameters, gradients=gradients, optimizer=optimizer_bytes, cpu=cpu)


# DeepSpeed offload_config.py defaults, used for the NVMe rung's pinned swap buffers.
DS_OFFLOAD_PARAM_BUFFER_COUNT = 5
DS_OFFLOAD_PARAM_BUFFER_SIZE = int(1e8)          # elements
DS_OFFLOAD_OPTIMIZER_BUFFER_COUNT = 4
DS_SUB_GROUP_SIZE = int(1e9)                     # zero config sub_group_size default (elements)


def states_zero3_nvme(params: int, largest_layer_params: int, precision: str, optimizer: str,
                      num_gpus_per_node: int, num_nodes: int,
                      additional_buffer_factor: float = DS_ADDITIONAL_BUFFER_FACTOR) -> ModelStates:
    """ZeRO-3 with parameters and optimizer offloaded to NVMe (ZeRO-Infinity). GUESS: DeepSpeed has
    no estimator for it.

    GPU: as with CPU offload of both (the largest-layer term of estimate_zero3_model_states_mem_needs).
    NVMe per machine: each local process swaps its partition of 16-bit weights, fp32 master and
    optimizer states: (param16 + 4 + states) * P / num_nodes.
    Host RAM per machine: the fp32 gradient partitions (4 * P / num_nodes, x1.5 as DeepSpeed does) plus
    every local process's pinned swap buffers: offload_param buffer_count * buffer_size 16-bit elements
    and offload_optimizer buffer_count fp32 buffers of one sub-group (min(sub_group_size, P/N)),
    defaults from deepspeed/runtime/zero/offload_config.py and config.py.
    """
    sb = state_bytes(precision, optimizer)
    param16, _, _ = _ds_multipliers(sb)
    world = num_gpus_per_node * num_nodes
    gpus_factor = 1 / num_nodes
    layer_params = sb.param * largest_layer_params
    layer_grads = sb.grad * largest_layer_params
    per_process_partition = math.ceil(params / world)
    swap_buffers = (DS_OFFLOAD_PARAM_BUFFER_COUNT * DS_OFFLOAD_PARAM_BUFFER_SIZE * param16
                    + DS_OFFLOAD_OPTIMIZER_BUFFER_COUNT * min(DS_SUB_GROUP_SIZE, per_process_partition) * 4)
    cpu = int(params * FP32_GRAD_BYTES * gpus_factor * additional_buffer_factor) + num_gpus_per_node * swap_buffers
    nvme = int(params * (param16 + FP32_MASTER_BYTES + sb.optim) * gpus_factor)
    return ModelStates(parameters=layer_params, gradients=layer_grads, optimizer=0, cpu=cpu, nvme=nvme)


def layer_and_root_params(params: int, hidden_size: int, layers: int, vocab_size: int,
                          tied_embeddings: bool) -> tuple[int, int]:
    """(parameters of one decoder layer, parameters outside the layers: embeddings + head).

    Approximation for FSDP's wrapping units: the embedding and, when untied, the LM head are V*h each;
    the rest is split evenly over the layers (final norm and biases are noise).
    """
    root = vocab_size * hidden_size * (1 if tied_embeddings else 2)
    root = min(root, params)
    layer = (params - root) // max(layers, 1)
    return layer, root


def states_fsdp(params: int, precision: str, optimizer: str, num_gpus_per_node: int, num_nodes: int,
                reshard: bool, offload: bool = False,
                additional_buffer_factor: float = DS_ADDITIONAL_BUFFER_FACTOR) -> ModelStates:
    """FSDP2 (torch.distributed.fsdp.fully_shard) with a MixedPrecisionPolicy.

    FSDP2 shards the original fp32 parameters, their fp32 gradients and the optimizer states over N
    (so there is no separate master copy): (4 + 4 + states) * P / N, i.e. the ZeRO paper's 16P/N for
    Adam (ZeRO-3 row of Fig. 1). Without resharding (reshard_after_forward=False, ~ZeRO-2) every
    layer's all-gathered compute-dtype weights stay alive from its forward until its backward, so
    the peak adds the whole unsharded model: + param16 * P (torch fully_shard docs,
    reshard_after_forward). With resharding only the layers in flight are unsharded (fsdp_buffers).
    CPUOffloadPolicy moves the sharded weights, gradients and optimizer states to host RAM.
    Host RAM: with fsdp_cpu_ram_efficient_loading only rank 0 loads the fp32 model (4P); with
    offload each machine also holds its processes' shards; x1.5 as DeepSpeed's estimators do. GUESS
    modelled on DeepSpeed's accounting; not checked against a measurement.
    """
    sb = state_bytes(precision, optimizer)
    world = num_gpus_per_node * num_nodes
    sharded_param = int(4 * params / world)
    sharded_grad = int(4 * params / world)
    sharded_optim = int(sb.optim * params / world)
    unsharded = 0 if reshard else sb.param * params
    if offload:
        per_machine = (4 + 4 + sb.optim) * (1 / num_nodes)
        cpu = int(params * max(4, per_machine) * additional_buffer_factor)
        return ModelStates(parameters=unsharded, gradients=0, optimizer=0, cpu=cpu)
    cpu = int(params * 4 * additional_buffer_factor)
    return ModelStates(parameters=sharded_param + unsharded, gradients=sharded_grad, optimizer=sharded_optim,
                       cpu=cpu)


# --- Activations and logits -----------------------------------------------------------------------
#
# Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
# (arXiv:2205.05198) section 4.1 gives the structure (per layer: norms, attention, s x s scores, MLP);
# every coefficient below was then MEASURED ON CPU WITH saved_tensors_hooks, see
# bench/measure_activations.py (transformers 5.24, torch 2.13, LlamaForCausalLM / GPT2LMHeadModel,
# distinct saved storages, parameters excluded), and differs from the paper's 16-bit Megatron figure
# (34 + 5as/h) in three places:
#   - HF's RMSNorm upcasts its input to fp32 and saves that copy (4 B) plus the normalised 16-bit
#     tensor (w) before the weight multiply: 4 + w per norm, where Megatron's LayerNorm saves w.
#   - a gated (SwiGLU/GeGLU) MLP saves four f-sized tensors (gate, up, act(gate), their product: 4*f*w),
#     not Megatron's two (18 + 4f/h); the memory-model author's 17 + 8f/h was right about the MLP.
#   - eager attention computes the softmax in fp32 (softmax(..., dtype=float32).to(dtype)): the fp32
#     probabilities (4 B) and their 16-bit cast (w) are both saved, 6 a*s^2*b bytes in bf16 where the
#     paper counts 5 with dropout (2 scores + 1 mask + 2 dropout output).
# What a CPU cannot show stays in MARGIN_FRACTION: the CUDA caching allocator's rounding and cached
# blocks, cuBLAS / flash-attention workspaces, NCCL buffers.


@dataclass(frozen=True)
class LayerProfile:
    """What one decoder layer of a model family saves for backward, beyond the shapes."""

    name: str
    gated_mlp: bool
    ffn_tensors: float          # f-sized tensors the MLP saves per token (per routed expert)
    rms_norm_fp32: bool         # HF RMSNorm: saves an fp32 copy of its input and the normalised tensor
    softmax_fp32: bool          # eager attention: softmax in fp32, then cast to the compute dtype
    backward_ffn_tensors: float  # f-sized gradients alive at once in one layer's backward (measured)
    post_norms: int = 0         # norms after attention / MLP whose output feeds no linear (Gemma-2 has two)
    norm_fp32_output: bool = False  # Gemma's RMSNorm: fp32 input copy and fp32 normalised tensor, 16-bit output
    softcap_scores: bool = False    # eager scores go through tanh soft-capping, which keeps its output (w)
    router_fp32: bool = False       # MoE router computes in fp32 and keeps its fp32 input (DeepSeek), 4 * h


# Llama / Mistral / Qwen2 / Qwen3 / Phi-3 / Mixtral: SwiGLU, LlamaRMSNorm, fp32 eager softmax.
# MEASURED (bench/measure_activations.py): 4 f-tensors; backward working set about 2.5 f-tensors.
GATED_PROFILE = LayerProfile("gated", gated_mlp=True, ffn_tensors=4, rms_norm_fp32=True, softmax_fp32=True,
                             backward_ffn_tensors=2.5)
# GPT-NeoX / Falcon / BLOOM / OPT: LayerNorm and a plain MLP whose activation is one native operator
# (GELU / ReLU) saving its input, plus the second linear's input: 2 f-tensors, Megatron's 4f/h in
# 16-bit. GUESS for the eager softmax dtype (several of them upcast, so fp32 is assumed: errs high).
PLAIN_PROFILE = LayerProfile("plain", gated_mlp=False, ffn_tensors=2, rms_norm_fp32=False, softmax_fp32=True,
                             backward_ffn_tensors=2)
# GPT-2 / GPT-J / CodeGen / Phi-1/2: "gelu_new", the tanh GELU written as Python arithmetic, which saves
# its input, x^3's input, the tanh output and two products: MEASURED 5 f-tensors with GPT-2, whose eager
# softmax runs in the compute dtype.
TANH_GELU_PROFILE = LayerProfile("gelu-tanh", gated_mlp=False, ffn_tensors=5, rms_norm_fp32=False,
                                 softmax_fp32=False, backward_ffn_tensors=2)

# T5 (relu DenseReluDense; v1.1 / flan gated variants take the gated profile through gated_mlp): T5LayerNorm
# keeps an fp32 copy like HF RMSNorm, and its eager softmax stays in the compute dtype. MEASURED
# (bench/measure_activations.py FAMILY_CONFIGS["t5"], eager): 2 f-tensors, 2 B per score in bf16.
T5_PROFILE = LayerProfile("t5", gated_mlp=False, ffn_tensors=2, rms_norm_fp32=True, softmax_fp32=False,
                          backward_ffn_tensors=2)
# Gemma-2: four RMSNorms per layer (pre and post attention and MLP) computed in fp32 (x.float(), then the
# normalised fp32 tensor; the 16-bit output is what the next linear saves), GeGLU (4 f-tensors), and eager
# attention (what transformers picks for it) with tanh soft-capping of the scores, whose output is kept:
# 4 + w + w per score. MEASURED (FAMILY_CONFIGS["gemma2"]): within 1 %.
GEMMA2_PROFILE = LayerProfile("gemma2", gated_mlp=True, ffn_tensors=4, rms_norm_fp32=True, softmax_fp32=True,
                              backward_ffn_tensors=2.5, post_norms=2, norm_fp32_output=True, softcap_scores=True)
# DeepSeek-V2/V3: the gated layer, with the MoE gate's F.linear on an fp32 copy of its input (MEASURED,
# FAMILY_CONFIGS["deepseek_v2"]).
DEEPSEEK_PROFILE = LayerProfile("deepseek", gated_mlp=True, ffn_tensors=4, rms_norm_fp32=True, softmax_fp32=True,
                                backward_ffn_tensors=2.5, router_fp32=True)
SPECIAL_PROFILES = {"t5": T5_PROFILE, "mt5": T5_PROFILE, "umt5": T5_PROFILE, "gemma2": GEMMA2_PROFILE,
                    "deepseek_v2": DEEPSEEK_PROFILE, "deepseek_v3": DEEPSEEK_PROFILE}

# Which config model_types have which layer, read from their transformers modeling code (the MLP
# class and its activation). Only the plain and tanh-GELU lists decide anything: every other
# model_type, listed here or not, gets the gated profile.
GATED_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
    "gemma3_text", "phi3", "phimoe", "olmo", "olmo2", "cohere", "cohere2", "granite", "granitemoe", "deepseek_v2",
    "deepseek_v3", "stablelm", "exaone4", "glm", "glm4", "smollm3", "ministral", "hunyuan_v1_dense",
})
TANH_GELU_MODEL_TYPES = frozenset({"gpt2", "gpt_neo", "gptj", "codegen", "phi"})
# BERT-style encoders: LayerNorm and an erf GELU (one native operator): MEASURED (FAMILY_CONFIGS["bert"]).
PLAIN_MODEL_TYPES = frozenset({"gpt_neox", "falcon", "bloom", "opt", "gpt_bigcode", "starcoder2", "mpt",
                               "nemotron", "arcee", "biogpt", "xglm", "bert", "roberta", "xlm-roberta",
                               "distilbert", "electra", "camembert", "bart", "mbart"})


def layer_profile(model_type: str | None, gated_mlp: bool | None = None) -> LayerProfile:
    """The profile of a model family from its config's model_type; `gated_mlp` overrides the MLP kind.

    Unknown or missing model types get the gated (Llama) profile: most current causal LMs are, and it
    is the larger of the two per-layer figures for the same shape.
    """
    kind = (model_type or "").lower()
    special = SPECIAL_PROFILES.get(kind)
    if special is not None and (gated_mlp is None or gated_mlp == special.gated_mlp):
        return special
    if special is T5_PROFILE and gated_mlp:   # T5 v1.1 / flan-T5: gated GELU, T5's norms and softmax
        return LayerProfile("t5-gated", gated_mlp=True, ffn_tensors=4, rms_norm_fp32=True, softmax_fp32=False,
                            backward_ffn_tensors=2.5)
    if gated_mlp is True or (gated_mlp is None and kind in GATED_MODEL_TYPES):
        return GATED_PROFILE
    if kind in TANH_GELU_MODEL_TYPES:
        return TANH_GELU_PROFILE
    if gated_mlp is False or kind in PLAIN_MODEL_TYPES:
        return PLAIN_PROFILE
    return GATED_PROFILE


def mlp_is_gated(model_type: str | None, gated_mlp: bool | None = None) -> bool:
    """True for SwiGLU/GeGLU MLPs (Llama, Mistral, Qwen, Gemma, Phi-3 ...), False for GPT-2/OPT/NeoX/Falcon/BLOOM."""
    return layer_profile(model_type, gated_mlp).gated_mlp


def _profile(profile: LayerProfile | None) -> LayerProfile:
    return GATED_PROFILE if profile is None else profile


def norm_bytes_per_token(hidden_size: int, precision: str, profile: LayerProfile | None = None) -> int:
    """One norm's saved bytes per token, including its output (the next linear's saved input).

    HF RMSNorm: the fp32 copy of the input (4 B; in fp32 the input itself), the normalised tensor
    before the weight multiply (w) and the output (w). LayerNorm (native): input and output, w each
    (its fp32 mean / rstd are per token). MEASURED, bench/measure_activations.py.
    """
    w = working_bytes(precision)
    p = _profile(profile)
    if p.norm_fp32_output:   # Gemma: fp32 input copy (4) and fp32 normalised tensor (4); the output (w) as above
        return (8 + w) * hidden_size
    per_element = 4 + 2 * w if p.rms_norm_fp32 else 2 * w
    return per_element * hidden_size


def attention_score_bytes(precision: str, profile: LayerProfile | None = None, attention_dropout: bool = False) -> int:
    """Bytes saved per attention score (a*s^2*b of them) by eager attention.

    Korthikanti et al. 4.1 count 2 (softmax output) + 1 (dropout mask) + 2 (dropout output) = 5 in
    16-bit. HF's Llama-family eager attention keeps the softmax in fp32 (4 B) and, without dropout,
    its cast to the compute dtype (w) for the PV matmul: 6 in bf16, 4 in fp32 (the cast is a no-op),
    MEASURED. With dropout the cast is not kept; the mask (1 B, torch's fused CUDA dropout; CPU's
    unfused dropout keeps it in the compute dtype) and the dropout output (w) are.
    """
    w = working_bytes(precision)
    p = _profile(profile)
    softmax = 4 if p.softmax_fp32 else w
    softcap = w if p.softcap_scores else 0
    if attention_dropout:
        return softmax + 1 + w + softcap
    return softmax + (w if softmax != w else 0) + softcap


def activation_bytes_per_layer(seq_len: int, micro_batch: int, hidden_size: int, heads: int,
                               intermediate_size: int | None, flash: bool, precision: str = "bf16",
                               profile: LayerProfile | None = None, kv_heads: int | None = None,
                               attention_dropout: bool = False, experts_per_token: int = 0,
                               shared_ffn: int = 0, head_dim: int | None = None, v_head_dim: int | None = None,
                               kv_lora_rank: int = 0, cross_attention: bool = False) -> int:
    """One decoder layer's saved activations in bytes (no tensor or sequence parallelism).

    Per token, w = bytes of the compute dtype (MEASURED on CPU with saved_tensors_hooks, see
    bench/measure_activations.py; structure from Korthikanti et al. 2022, arXiv:2205.05198, 4.1):
    - two norms with their outputs (norm_bytes_per_token): 2 * (4 + 2w) * h with HF RMSNorm;
    - attention inputs and output: flash / SDPA keep q, k, v and the output (which is o_proj's input):
      w * h * (2 + 2 * kv_heads / heads); eager repeats k, v to every head and copies the output for
      o_proj: 4 * w * h;
    - eager only: a * s * attention_score_bytes (6 in bf16) per token, the s x s scores;
    - the MLP: ffn_tensors * f * w (gated: gate, up, act(gate), product = 4 * f * w); MoE: times the
      experts routed per token, plus 2 * k * w * h for the dispatched inputs and weighted outputs
      (MEASURED with Mixtral; f is then the expert's intermediate size).
    In bf16, MHA, flash: h * (24 + 8 f / h), where Megatron-LM's theoretical_memory_usage.py has
    h * (18 + 4 f / h) and the paper h * 34 at f = 4h.
    Flash attention (Dao et al. 2022; flash_attn and SDPA's CUDA flash / memory-efficient / cuDNN
    kernels) saves q, k, v, its output and an fp32 logsumexp (a * s * b * 4 B, below 1 %); CPU SDPA
    (_scaled_dot_product_flash_attention_for_cpu) saves exactly the same, which is what was measured.
    The shared rotary cos/sin (2 * w * h / heads per token, once per model) are left out (< 1 %).
    Beyond the Llama layout (MEASURED with the FAMILY_CONFIGS of bench/measure_activations.py):
    - head_dim / v_head_dim when heads * head_dim != h (Gemma-2, DeepSeek's MLA): q, k, v and the output
      are counted at their own widths;
    - kv_lora_rank (MLA): the compressed key/value and its RMSNorm, (4 + 2w) * rank;
    - profile.post_norms (Gemma-2): norms whose output feeds no linear, 8 B per element each;
    - shared_ffn: a shared expert's MLP (Qwen-MoE, DeepSeek) next to the routed ones;
    - cross_attention (encoder-decoder decoders): a third norm, a second attention over the encoder's
      states (taken as long as the decoder's) and its scores.
    """
    p = _profile(profile)
    w = working_bytes(precision)
    h = hidden_size
    f = intermediate_size or 4 * h
    kv = kv_heads or heads
    hd = head_dim or h // heads
    vd = v_head_dim or hd
    attention_blocks = 2 if cross_attention else 1
    per_token = (2 + (1 if cross_attention else 0)) * norm_bytes_per_token(h, precision, p)
    per_token += p.post_norms * 8 * h
    if flash:
        attention = w * (heads * hd + kv * hd + kv * vd + heads * vd)
    else:
        attention = w * (2 * heads * hd + 2 * heads * vd)       # k and v repeated to every head
    if head_dim is None and v_head_dim is None:
        attention = w * (2 * h + (2 * h * kv) // heads) if flash else 4 * w * h   # the Llama layout, as measured
    per_token += attention * attention_blocks
    if kv_lora_rank:
        # The compressed key/value and its RMSNorm, (4 + 2w) * rank; the query projection's output is kept
        # whole (its rotary part is sliced, rotated and concatenated back) and so is the compressed kv
        # before its split: w * (heads * head_dim + rank). MEASURED within about 1 % of the layer.
        per_token += (4 + 2 * w) * kv_lora_rank + w * (heads * hd + kv_lora_rank)
    per_token += int(p.ffn_tensors * f * w) * max(experts_per_token, 1)
    if shared_ffn:
        per_token += int(p.ffn_tensors * shared_ffn * w)
    if experts_per_token:
        # MoE dispatch: each routed copy of the token's input and of its weighted expert output (MEASURED
        # with Mixtral, transformers 5.24); the router's logits and indices are per token, negligible.
        per_token += 2 * experts_per_token * w * h
        if p.router_fp32:
            per_token += 4 * h
    total = seq_len * micro_batch * per_token
    if not flash:
        total += attention_blocks * heads * seq_len * seq_len * micro_batch * attention_score_bytes(
            precision, p, attention_dropout)
    return total


def activation_bytes(seq_len: int, micro_batch: int, hidden_size: int, heads: int, layers: int,
                     intermediate_size: int | None, flash: bool, gradient_checkpointing: bool,
                     precision: str = "bf16", profile: LayerProfile | None = None, kv_heads: int | None = None,
                     attention_dropout: bool = False, experts_per_token: int = 0) -> int:
    """All layers' activations per GPU (ZeRO and FSDP do not partition activations), in `precision`.

    Without checkpointing: every layer's saved tensors plus the final norm's (norm_bytes_per_token,
    whose output is the LM head's input); this is what is alive when backward starts, and the logits
    term is added on top of it (MEASURED: the step's peak is exactly their sum).
    Full recomputation (HF gradient_checkpointing=True, non-reentrant): each layer keeps only its
    input, w * s * b * h (Korthikanti et al. 4.2 count 2 * s * b * h in 16-bit; MEASURED), and the
    backward of one layer rematerialises its full activations and holds its gradients
    (backward_working_bytes_per_token, MEASURED). That layer's peak and the logits' peak happen at
    different moments of backward: the plan adds only the larger of the two (peak_activation_bytes).
    """
    p = _profile(profile)
    w = working_bytes(precision)
    kwargs = dict(precision=precision, profile=p, kv_heads=kv_heads, attention_dropout=attention_dropout,
                  experts_per_token=experts_per_token)
    per_layer = activation_bytes_per_layer(seq_len, micro_batch, hidden_size, heads, intermediate_size, flash,
                                           **kwargs)
    tokens = seq_len * micro_batch
    if gradient_checkpointing:
        backward = tokens * backward_working_bytes_per_token(seq_len, hidden_size, heads, intermediate_size, flash,
                                                             precision, p, experts_per_token)
        return w * tokens * hidden_size * layers + per_layer + backward
    return per_layer * layers + tokens * norm_bytes_per_token(hidden_size, precision, p)


def frozen_base_unsaved_bytes_per_token(hidden_size: int, intermediate_size: int | None, flash: bool,
                                        precision: str = "bf16", profile: LayerProfile | None = None,
                                        experts_per_token: int = 0) -> int:
    """Bytes per token that one layer does NOT save for backward when its weights are frozen (LoRA's base).

    Autograd saves a matmul's input only for the weight's gradient (y = x W^T: dx needs W, dW needs x), and
    a norm's normalised tensor only for the norm weight's gradient. With the base frozen these are never
    saved: each norm's output (the next linear's input) and, for HF RMSNorm, its normalised tensor before
    the weight multiply (w each); the MLP's last intermediate (down_proj's input, w * f); with eager
    attention the reshaped output copy that only o_proj keeps (w * h). Flash / SDPA keep their own output,
    which is o_proj's input, so nothing is saved there. MEASURED (torch 2.13, transformers LlamaForCausalLM
    h=256 f=704, bf16, CPU, saved_tensors_hooks): the full layer saves 11800 B/token, the frozen one 8344,
    exactly 2 * 2wh + wf less; eager 13960 against 17928, 2 * 2wh + wf + wh less.
    """
    p = _profile(profile)
    w = working_bytes(precision)
    f = intermediate_size or 4 * hidden_size
    per_norm = 2 * w * hidden_size if p.rms_norm_fp32 else w * hidden_size
    unsaved = 2 * per_norm + int(w * f) * max(experts_per_token, 1)
    if not flash:
        unsaved += w * hidden_size
    return unsaved


def backward_working_bytes_per_token(seq_len: int, hidden_size: int, heads: int, intermediate_size: int | None,
                                     flash: bool, precision: str = "bf16", profile: LayerProfile | None = None,
                                     experts_per_token: int = 0) -> int:
    """Bytes per token that one layer's backward holds on top of that layer's saved activations.

    MEASURED (bench/measure_activations.py, the live-storage tracker): the MLP's backward holds about
    profile.backward_ffn_tensors f-sized gradients at once. Eager attention's softmax backward holds
    its incoming and outgoing gradients (fp32 for the Llama family: 8 B per score, less the 16-bit
    cast copy already freed), by which time the MLP's and the second norm's saved tensors are gone;
    the larger of the two phases counts. Flash attention's backward is below the MLP phase (dq, dk,
    dv are h-sized).
    """
    p = _profile(profile)
    w = working_bytes(precision)
    f = intermediate_size or 4 * hidden_size
    experts = max(experts_per_token, 1)
    mlp_phase = int(p.backward_ffn_tensors * f * w) * experts
    if flash:
        return mlp_phase
    softmax = 4 if p.softmax_fp32 else w
    cast = w if softmax != w else 0
    scores = heads * seq_len * (2 * softmax - cast)
    freed = int(p.ffn_tensors * f * w) * experts + norm_bytes_per_token(hidden_size, precision, p)
    return max(mlp_phase, scores - freed)


def ssm_bytes_per_token(inner_size: int, state_size: int, precision: str = "bf16") -> int:
    """One Mamba block's saved bytes per token, as transformers runs it without the mamba_ssm kernels.

    MEASURED (bench/measure_activations.py FAMILY_CONFIGS["mamba"], bf16, transformers 5.24
    MambaMixer.slow_forward, the path taken when mamba_ssm / causal_conv1d are not installed, and on CPU):
    the discretised A and B*u, fp32 [b, d_inner, s, N] (8 B per d_inner*N), and the scan's per-step fp32
    and 16-bit states (4 + w): (12 + w) * d_inner * N; the projections, convolution, gate and norm keep
    about 31 B per d_inner in bf16 (15.5 * w, scaled with w for fp32: a GUESS there). The fused
    mamba_ssm CUDA kernels recompute the scan in backward and keep far less: this is the upper figure.
    """
    w = working_bytes(precision)
    return (12 + w) * inner_size * state_size + int(15.5 * w * inner_size)


@dataclass(frozen=True)
class LayerStack:
    """The layers of one model as the activation arithmetic needs them (built by plan from a ModelShape)."""

    hidden: int
    heads: int
    kv_heads: int
    layers: int                       # all layers (encoder + decoder for encoder-decoder models)
    ffn: int                          # the dense MLP's width
    profile: LayerProfile = None      # type: ignore[assignment]  (None: the gated profile)
    experts_per_token: int = 0
    expert_ffn: int = 0               # one routed expert's width (0: ffn)
    shared_ffn: int = 0               # the shared expert(s) width in MoE layers
    moe_layers: int = 0               # layers with routed experts (the rest are dense)
    cross_attention_layers: int = 0   # decoder layers of an encoder-decoder model
    head_dim: int | None = None
    v_head_dim: int | None = None
    kv_lora_rank: int = 0
    ssm_state: int = 0                # Mamba: state size (0: attention layers)
    ssm_inner: int = 0
    attention_dropout: bool = False   # dropout on the attention probabilities in training (BERT, GPT-2 configs)


def _layer_kinds(stack: LayerStack, seq: int, batch: int, flash: bool, precision: str,
                 attention_dropout: bool) -> list[tuple[int, int, int]]:
    """(count, saved bytes per layer, backward working bytes per token) for each kind of layer."""
    p = _profile(stack.profile)
    tokens = seq * batch
    if stack.ssm_state:
        per_layer = tokens * ssm_bytes_per_token(stack.ssm_inner, stack.ssm_state, precision)
        # GUESS: one block's backward holds about its saved tensors again (not measured).
        return [(stack.layers, per_layer, per_layer // max(tokens, 1))]
    common = dict(precision=precision, profile=p, kv_heads=stack.kv_heads, attention_dropout=attention_dropout,
                  head_dim=stack.head_dim, v_head_dim=stack.v_head_dim, kv_lora_rank=stack.kv_lora_rank)
    kinds = []
    moe = min(stack.moe_layers, stack.layers) if stack.experts_per_token else 0
    cross = min(stack.cross_attention_layers, stack.layers)
    plain = stack.layers - moe - cross
    if moe:
        f = stack.expert_ffn or stack.ffn
        per_layer = activation_bytes_per_layer(seq, batch, stack.hidden, stack.heads, f, flash,
                                               experts_per_token=stack.experts_per_token,
                                               shared_ffn=stack.shared_ffn, **common)
        backward = backward_working_bytes_per_token(seq, stack.hidden, stack.heads, f, flash, precision, p,
                                                    stack.experts_per_token)
        kinds.append((moe, per_layer, backward))
    for count, is_cross in ((plain, False), (cross, True)):
        if count > 0:
            per_layer = activation_bytes_per_layer(seq, batch, stack.hidden, stack.heads, stack.ffn, flash,
                                                   cross_attention=is_cross, **common)
            backward = backward_working_bytes_per_token(seq, stack.hidden, stack.heads, stack.ffn, flash,
                                                        precision, p)
            kinds.append((count, per_layer, backward))
    return kinds


def stack_activation_bytes(stack: LayerStack, seq_len: int, micro_batch: int, flash: bool,
                           gradient_checkpointing: bool, precision: str = "bf16",
                           attention_dropout: bool = False) -> int:
    """activation_bytes for a whole model whose layers differ: dense and MoE layers (DeepSeek keeps its
    first layers dense), encoder and decoder layers (T5's decoder adds cross-attention), Mamba blocks.

    For a uniform decoder it equals activation_bytes. Without checkpointing: every layer's saved tensors
    plus the final norm's. With full recomputation: each layer's input, plus the largest layer's full
    activations and its backward working set (as activation_bytes)."""
    return sum(stack_activation_parts(stack, seq_len, micro_batch, flash, gradient_checkpointing, precision,
                                      attention_dropout))


def stack_activation_parts(stack: LayerStack, seq_len: int, micro_batch: int, flash: bool,
                           gradient_checkpointing: bool, precision: str = "bf16",
                           attention_dropout: bool = False) -> tuple[int, int]:
    """stack_activation_bytes in two parts: (kept until backward reaches them, recomputed).

    kept: without checkpointing every layer's saved tensors and the final norm's; with full recomputation
    each layer's input. recomputed: with checkpointing, the largest layer's rematerialised activations and
    its backward working set, alive only while backward runs through that layer (0 without checkpointing).
    The recomputed part never coexists with the loss's peak (peak_activation_bytes)."""
    p = _profile(stack.profile)
    w = working_bytes(precision)
    tokens = seq_len * micro_batch
    kinds = _layer_kinds(stack, seq_len, micro_batch, flash, precision, attention_dropout or stack.attention_dropout)
    if gradient_checkpointing:
        _, per_layer, backward = max(kinds, key=lambda k: k[1] + tokens * k[2])
        return w * tokens * stack.hidden * stack.layers, per_layer + tokens * backward
    return sum(count * per_layer for count, per_layer, _ in kinds) + tokens * norm_bytes_per_token(
        stack.hidden, precision, p), 0


def checkpoint_reenters_call(transformers_version: str | None) -> bool:
    """Whether this transformers checkpoints a layer's __call__ reentrantly when gradient_checkpointing_kwargs is
    unset: 4.x does (use_reentrant=True around the module call, FSDP1's hooks included); 5.x checkpoints the
    layer's forward. False for an unknown version."""
    major = (transformers_version or "").split(".")[0]
    return major.isdigit() and int(major) < 5


def fsdp1_retained_checkpoint_bytes(tokens: int, hidden_size: int, layers: int, precision: str) -> int:
    """What FSDP1 keeps alive in addition, at the layers' backward peak, when reentrant checkpointing re-runs
    frozen FSDP1 units (LoRA / QLoRA: peft's wrap policy puts the adapters in units of their own, so each
    decoder layer's unit has no trainable parameter): w * h * (L - 2) per token.

    transformers 4.x checkpoints the FSDP wrapper's __call__ reentrantly (use_reentrant=True when
    gradient_checkpointing_kwargs is unset), so FSDP1's _pre_forward runs again inside the recompute and, for a
    frozen flat parameter, registers a multi-grad hook (_register_post_backward_reshard_only_hook) on the
    detached layer input. The hook holds that leaf's AccumulateGrad node, which owns the leaf: each
    back-propagated layer's input and its .grad stay alive until FSDP's final callback removes the hooks at the
    end of backward, so the layers' backward peaks at layer 0 instead of at the first recomputed layer.
    MEASURED on CPU (bench/measure_fsdp_activations.py, bench/results/fsdp-activations.md; torch 2.4.1 and 2.13,
    transformers 4.45.2, peft 0.13.2, 2 ranks over gloo): the excess is exactly 2h(L-2) B per token in bf16 at
    every shape tried (h 256-1024, L 4-8, V 2000-4000), nothing with non-reentrant checkpointing, FSDP2, or
    transformers 5 (which checkpoints the layer's forward, outside the FSDP hooks); removing the hook removes it.
    """
    return working_bytes(precision) * hidden_size * max(layers - 2, 0) * tokens


def peak_activation_bytes(kept: int, recomputed: int, loss_peak: int) -> int:
    """The activations to add to the loss's peak (logits_bytes) for the step's peak: kept + recomputed, less
    the part of the recomputed layer that the loss's peak already covers.

    Under gradient checkpointing the loss's backward frees the logits and their gradients before backward
    reaches the last layer and recomputes it, so the step's peak is kept + max(loss peak, recomputed layer),
    not their sum. MEASURED on CPU (bench/measure_activations.py, the live-storage tracker; tiny Llama h256
    L4 s256 b2 bf16 SDPA, non-reentrant): V=32000 peaks at 198.8 MB against 197.7 MB for the max and
    205.5 MB for the sum; V=2000 at 14.5 MB against 13.3 and 21.2. The fit half agrees (bench_memory_model:
    the gist's checkpointed ZeRO rows). Without checkpointing recomputed is 0 and the sum stands (MEASURED:
    the step's peak is exactly kept + loss peak)."""
    return kept + max(0, recomputed - loss_peak)


def autocast_weight_bytes(matmul_params: int, layer_params: int, head_params: int, precision: str,
                          gradient_checkpointing: bool) -> int:
    """torch autocast's 16-bit copies of fp32 weights, alive at the start of backward (single GPU / DDP only).

    Under AMP (what the HF Trainer and Accelerate use without DeepSpeed) the weights stay fp32 and each
    matmul casts its weight to bf16/fp16; torch caches the cast for the autocast region, and the cast
    weight is what the linear saves for backward, so the copies outlive the forward: 2 B per parameter
    that goes through a matmul (the input embedding is a lookup, not cast; a tied LM head is).
    With checkpointing the layers save nothing in forward: the copies alive are the LM head's (it is
    not checkpointed) and the recomputed layer's. Not on ZeRO (accelerate's Accelerator sets native_amp
    False for DeepSpeed, accelerator.py: the engine runs a 16-bit module) nor FSDP (the all-gathered
    weights are already param_dtype = the mixed-precision dtype, so the cast is a no-op). fp32: none.
    """
    if precision == "fp32":
        return 0
    if gradient_checkpointing:
        return 2 * (head_params + layer_params)
    return 2 * matmul_params


# --- Host RAM of loading the model ----------------------------------------------------------------

def load_host_bytes(params: int, weights_bytes: int, processes_per_machine: int, loader: str,
                    largest_module_params: int = 0) -> int:
    """Host RAM per machine (the busiest one) while transformers loads the pretrained model.

    The rule, read from transformers 5.24 modeling_utils.py and accelerate 1.15:
    - from_pretrained's dtype defaults to "auto" (from_pretrained: `if dtype is None: dtype = "auto"`),
      and _get_dtype then takes config.dtype: the checkpoint's stored dtype, `weights_bytes` per parameter
      (2 for a bf16 checkpoint), not fp32.
    - "every": single GPU, DDP, ZeRO-1/2 (and FSDP without fsdp_cpu_ram_efficient_loading). The model is
      built on the meta device (get_init_context) and _load_pretrained_model materialises every weight
      on the CPU from memory-mapped safetensors (convert_and_load_state_dict_in_model); the mapped file
      pages are page cache, shared and reclaimable. Each local process holds P * weights_bytes until it
      moves the model to its GPU: processes_per_machine * P * weights_bytes.
    - "rank0": ZeRO-3 with zero.Init (HF Trainer / accelerate zero3_init_flag: is_deepspeed_zero3_enabled)
      makes _load_pretrained_model read the whole state dict with map_location="cpu" on global rank 0
      only ("meta" elsewhere) and scatter it into the partitioned parameters
      (_load_state_dict_into_zero3_model): P * weights_bytes on machine 0.
    - "local-rank0": FSDP with fsdp_cpu_ram_efficient_loading (the wizard's default; accelerate exports
      FSDP_CPU_RAM_EFFICIENT_LOADING, transformers is_fsdp_enabled) loads on local rank 0 only and
      keeps the other ranks on meta: P * weights_bytes per machine.
    - "device": QLoRA without ZeRO-3. bitsandbytes' quantiser sets device_map={"": current GPU} when none
      is given (quantizer_bnb_4bit.update_device_map; TrainingArguments, built first, has set each rank's
      GPU), so every tensor goes from the mapped file to the GPU, where it is quantised: a process holds at
      most one module's weights in transit, counted as the largest module (DeepSpeed's largest layer: a
      Linear, a fused expert block or the embedding): processes_per_machine * largest_module_params *
      weights_bytes.
    """
    if loader == "device":
        return processes_per_machine * largest_module_params * weights_bytes
    copies = {"every": processes_per_machine, "rank0": 1, "local-rank0": 1}[loader]
    return params * weights_bytes * copies


def offloaded_host_bytes(states: ModelStates, params: int, precision: str, optimizer: str, num_nodes: int,
                         zero_stage: int | None, offload_optimizer: bool, offload_param: bool,
                         additional_buffer_factor: float = DS_ADDITIONAL_BUFFER_FACTOR) -> int:
    """Host RAM per machine of the states an offload rung keeps there (after loading).

    ZeRO-3 (zero_init) and the NVMe rung: their estimators' figures have no loading term. ZeRO-1/2
    optimizer offload: every local process's partition of the CPU optimizer (fp32 master, fp32 gradients,
    optimizer states, _ds_multipliers) = cpu_optimizer * P / num_nodes, x1.5 as DeepSpeed's estimator
    (whose max(4 * total_gpus, 16) counts the fp32 model load instead, see load_host_bytes).
    """
    if not (offload_optimizer or offload_param):
        return 0
    if zero_stage in (1, 2):
        _, _, cpu_optimizer = _ds_multipliers(state_bytes(precision, optimizer))
        return int(params * cpu_optimizer / num_nodes * additional_buffer_factor)
    return states.cpu


# MEASURED (bench/measure_activations.py, bf16 and fp32 alike): the peak of the loss path is in
# backward, at LogSoftmaxBackward: the saved fp32 log-softmax (4 B), the fp32 gradient coming from
# the NLL loss (4 B) and the fp32 gradient it produces (4 B).
LOGITS_PEAK_BYTES_PER_ELEMENT = 12


def logits_bytes(seq_len: int, micro_batch: int, vocab_size: int, precision: str) -> int:
    """The LM head's logits and the loss at their peak: 12 bytes per s*b*V element, any precision.

    transformers' ForCausalLMLoss upcasts the logits (logits.float()) and cross-entropy saves its fp32
    log-softmax. In forward, the 16-bit logits (w), the fp32 upcast (4) and the log-softmax (4) coexist
    for a moment (10 B in bf16); the HF Trainer drops the model output before backward, whose
    LogSoftmaxBackward then holds the saved log-softmax, the incoming and the outgoing fp32 gradients:
    12 B per element, the larger of the two (MEASURED on CPU, bench/measure_activations.py). In fp32
    the forward moment is 8 B and the backward one is the same 12 B. Megatron's output-layer term
    (4*s*b*h*(1 + V/h)) counts 4 B per element. A fused / chunked cross-entropy (Liger) avoids most of it
    (sequence.loss_bytes).
    """
    del precision
    return seq_len * micro_batch * vocab_size * LOGITS_PEAK_BYTES_PER_ELEMENT


# --- Framework buffers ----------------------------------------------------------------------------

# What the emitter writes into ds_config.json ("auto" filled by the HF Trainer with these values,
# transformers integrations/deepspeed.py trainer_config_finalize; Accelerate fills the same keys).
DS_MAX_LIVE_PARAMETERS = int(1e9)   # stage3_max_live_parameters default (zero/config.py)


def deepspeed_bucket_settings(hidden_size: int) -> dict[str, int | bool]:
    """The bucket sizes the memory model assumes (elements), as HF's "auto" resolves them.

    reduce_bucket_size = h*h, stage3_prefetch_bucket_size = int(0.9*h*h),
    stage3_param_persistence_threshold = 10*h (transformers trainer_config_finalize);
    stage3_max_live_parameters = 1e9 and overlap_comm = True (HF's example configs; DeepSpeed's own
    default is True for stage 3). The emitter should write the same values so the estimate holds.
    """
    return {
        "reduce_bucket_size": hidden_size * hidden_size,
        "allgather_bucket_size": hidden_size * hidden_size,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "stage3_param_persistence_threshold": 10 * hidden_size,
        "stage3_max_live_parameters": DS_MAX_LIVE_PARAMETERS,
        "overlap_comm": True,
    }


def ddp_buffers(params: int, precision: str) -> int:
    """DDP's gradient buckets: a second copy of every gradient.

    torch DDP (reducer.cpp, initialize_buckets) allocates one flat tensor per bucket and every
    parameter belongs to a bucket, so the buckets total one full gradient copy whatever
    bucket_cap_mb (25 MiB) is; the torch docs for gradient_as_bucket_view say setting it "can
    reduce peak memory usage, where the saved memory size will be equal to the total gradients
    size". The HF Trainer leaves it False. Under AMP the gradients are fp32 (4 B).
    """
    del precision
    return 4 * params


def zero12_buffers(hidden_size: int, stage: int, precision: str, overlap_comm: bool = True) -> int:
    """DeepSpeed ZeRO-1/2 independent-partition-gradient buckets.

    stage_1_and_2.py setup_buckets: with contiguous_gradients one torch.empty(reduce_bucket_size) per
    gradient dtype, and a second one when overlap_comm ("Use double buffers"). Stage 1 stages the
    fp32 accumulator there (4 B); stage 2 keeps the low-precision dtype. allgather_bucket_size only
    shards the all-gather into views of the existing flat weights (runtime/utils.py
    all_gather_dp_groups), so it allocates nothing extra.
    """
    elements = deepspeed_bucket_settings(hidden_size)["reduce_bucket_size"]
    dtype_bytes = 4 if stage == 1 else working_bytes(precision)
    return elements * dtype_bytes * (2 if overlap_comm else 1)


def zero3_step_bytes(params: int, world: int, precision: str, offload_optimizer: bool = False,
                     sub_group_size: int = DS_SUB_GROUP_SIZE) -> int:
    """What ZeRO-3's optimizer step adds on the GPU: the fp32 gradients of one sub-group and, while they are made,
    the flattened copy they are cast from.

    stage3.py _prepare_fp32_grad_for_sub_group: self.flatten(averaged_gradients[i]) (a new model-dtype tensor of
    the sub-group's size) .to(fp32) (a second one, 4 B per element; a no-op cast in fp32), kept as the fp32
    partition's .grad until _release_sub_group frees it; sub-groups hold min(sub_group_size, P / N) elements
    (the emitter writes DeepSpeed's default 1e9). It happens after backward, when activations and logits are
    freed: zero3_buffers counts it against them. With optimizer offload the step runs on the host: nothing."""
    if offload_optimizer:
        return 0
    elements = min(sub_group_size, math.ceil(params / max(world, 1)))
    w = working_bytes(precision)
    return elements * (w + 4 if w != 4 else 4)


def zero3_buffers(params: int, hidden_size: int, precision: str, world: int, offload_param: bool = False,
                  step_bytes: int = 0, freed_before_step: int = 0) -> int:
    """DeepSpeed ZeRO-3 working buffers beyond the model states, at the larger of the backward's and the step's
    peak.

    - IPG bucket: one torch.empty(reduce_bucket_size) per dtype (stage3.py, after
      initialize_optimizer_states).
    - Gathered parameters: the partitioned-parameter coordinator keeps at most
      stage3_max_live_parameters elements all-gathered (partitioned_param_coordinator.py,
      __max_n_available_params); prefetched parameters count toward the same cap, so
      stage3_prefetch_bucket_size is inside it. Counted as min(1e9, P) 16-bit elements: an upper
      bound, conservative on purpose (max_reuse_distance=1e9 lets parameters stay gathered between
      forward and backward). None where nothing is gathered (zero3_gathers: one process, partitions on the GPU).
    - The optimizer step's fp32 sub-group gradients (zero3_step_bytes): they come after backward, when the
      gathered parameters are released and the activations and logits (`freed_before_step`) are gone, so the
      peak holds the larger of the two: gathered + activations + logits, or the step's bytes.
    - Parameters below stage3_param_persistence_threshold (10h: norms, biases) stay unpartitioned;
      ignored, they are a few MiB.
    """
    settings = deepspeed_bucket_settings(hidden_size)
    wb = working_bytes(precision)
    ipg = int(settings["reduce_bucket_size"]) * wb
    live = min(int(settings["stage3_max_live_parameters"]), params) * wb if zero3_gathers(world, offload_param) else 0
    return ipg + max(live, step_bytes - freed_before_step)


def fsdp_buffers(layer_params: int, root_params: int, precision: str, reshard: bool) -> int:
    """FSDP2 unsharded buffers: HEURISTIC from how fully_shard schedules all-gathers.

    - The root module (embeddings, LM head) is not resharded after forward (fully_shard sets the
      root's reshard_after_forward to False), so its compute-dtype weights stay gathered.
    - With resharding, the current layer and the one prefetched (implicit forward/backward prefetch)
      are gathered: 2 layers. Without resharding the gathered weights are already counted in the
      model states.
    - Backward holds one layer's unsharded gradients plus the reduce-scatter input: 2 layers of
      gradients in the compute dtype.
    """
    wb = working_bytes(precision)
    gathered = root_params * wb + (2 * layer_params * wb if reshard else 0)
    return gathered + 2 * layer_params * wb


def margin_bytes(subtotal: int) -> int:
    """Fragmentation allowance: MARGIN_FRACTION of the allocator-managed bytes (HEURISTIC)."""
    return int(subtotal * MARGIN_FRACTION)


def usable_bytes(capacity: int, headroom: float) -> int:
    """The fit rule: an estimate fits when it is <= (1 - headroom) * capacity."""
    return int(capacity * (1 - headroom))


__all__ = [
    "GiB", "OPTIMIZER_STATE_BYTES", "GUESSED_OPTIMIZERS", "MARGIN_FRACTION", "CPU_PROCESS_OVERHEAD_BYTES",
    "CUDA_CONTEXT_BYTES", "frozen_base_unsaved_bytes_per_token",
    "StateBytes", "ModelStates", "state_bytes", "working_bytes", "optimizer_state_bytes", "optimizer_for_rung",
    "ds_estimate_zero2_model_states_mem_needs", "ds_estimate_zero3_model_states_mem_needs",
    "states_single_or_ddp", "states_zero1", "states_zero2", "states_zero3", "states_zero3_nvme", "states_fsdp",
    "layer_and_root_params", "activation_bytes_per_layer", "activation_bytes", "logits_bytes",
    "stack_activation_parts", "peak_activation_bytes", "fsdp1_retained_checkpoint_bytes",
    "checkpoint_reenters_call",
    "LayerProfile", "GATED_PROFILE", "PLAIN_PROFILE", "TANH_GELU_PROFILE", "layer_profile", "mlp_is_gated",
    "norm_bytes_per_token", "attention_score_bytes", "backward_working_bytes_per_token",
    "LOGITS_PEAK_BYTES_PER_ELEMENT", "T5_PROFILE",
    "GEMMA2_PROFILE", "LayerStack", "stack_activation_bytes",
    "ssm_bytes_per_token", "autocast_weight_bytes", "load_host_bytes", "offloaded_host_bytes",
    "deepspeed_bucket_settings", "ddp_buffers", "zero12_buffers", "zero3_buffers", "zero3_step_bytes",
    "zero3_gathers", "zero3_grad_partition_bytes", "fsdp_buffers",
    "margin_bytes", "usable_bytes",
]
