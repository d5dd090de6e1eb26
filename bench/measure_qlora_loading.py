"""Where a QLoRA model lives on each rank right after from_pretrained under accelerate's FSDP (CPU, 2 ranks, gloo).

The plan's loading peak for sharded QLoRA (wizard.sizing.lora.qlora_load_gpu_bytes) says every rank quantises the
whole model onto its own device before FSDP shards it, because transformers builds quantised models outside
FSDP's RAM-efficient (rank 0 loads, the others stay on meta) path. This runs that path for real on this CPU:
accelerate's environment for FSDP with cpu_ram_efficient_loading, a process group, and a tiny random Llama saved
as bf16 safetensors; each rank loads it twice, as plain bf16 and as NF4 (bnb_4bit_quant_storage=bf16, as the
wizard writes), and reports the bytes it holds on a real device against those on meta. On GPUs bitsandbytes'
quantiser puts the model on the rank's own GPU (device_map {"": current GPU}); here the device is the CPU.

    python bench/measure_qlora_loading.py            # prints a table, writes bench/results/qlora-loading.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "qlora-loading.md"


def _held_bytes(model, uss_before: int) -> dict[str, int]:
    """Bytes of parameters and buffers on a real device and on meta, and how much this process's private memory
    (USS: not the page cache a memory-mapped safetensors file shares between ranks) grew while loading."""
    import psutil
    out = {"device": 0, "meta": 0, "private_growth": psutil.Process().memory_full_info().uss - uss_before}
    for t in list(model.parameters()) + list(model.buffers()):
        out["meta" if t.is_meta else "device"] += t.numel() * t.element_size()
    return out


def _uss() -> int:
    import gc

    import psutil
    gc.collect()
    return psutil.Process().memory_full_info().uss


def _rank_main(rank: int, world: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"})
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.distributed.fsdp import is_fsdp_enabled

    dist.init_process_group("gloo", rank=rank, world_size=world)
    report = {"rank": rank, "fsdp_enabled": is_fsdp_enabled()}
    before = _uss()
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    report["bf16"] = _held_bytes(plain, before)
    del plain
    before = _uss()
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    nf4 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, quantization_config=quant)
    report["nf4"] = _held_bytes(nf4, before)
    report["nf4_quantised_layers"] = sum(1 for m in nf4.modules() if type(m).__name__ == "Linear4bit"
                                         and getattr(m.weight, "bnb_quantized", False) and not m.weight.is_meta)
    (Path(out_dir) / f"rank-{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(hidden: int, layers: int) -> list[dict]:
    """Both ranks' reports for a random Llama of this width and depth, saved as bf16 and loaded under FSDP."""
    import torch
    import torch.multiprocessing as mp
    from transformers import LlamaConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                             num_attention_heads=8, num_key_value_heads=8, vocab_size=4096,
                             tie_word_embeddings=False)
        torch.manual_seed(0)
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)
        out_dir = Path(tmp) / "reports"
        out_dir.mkdir()
        mp.spawn(_rank_main, args=(2, str(model_dir), _free_port(), str(out_dir)), nprocs=2, join=True)
        return [json.loads((out_dir / f"rank-{r}.json").read_text()) for r in (0, 1)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    import bitsandbytes
    import torch
    import transformers

    reports = measure(hidden=1024, layers=8)
    versions = (f"torch {torch.__version__}, transformers {transformers.__version__}, "
                f"bitsandbytes {bitsandbytes.__version__}")
    rows = ["| rank | load | parameters and buffers on a device (bytes) | on meta (bytes) | "
            "private memory growth while loading (bytes) |", "|---|---|---|---|---|"]
    for r in reports:
        for load in ("bf16", "nf4"):
            rows.append(f"| {r['rank']} | {load} | {r[load]['device']:,} | {r[load]['meta']:,} | "
                        f"{r[load]['private_growth']:,} |")
    rank1 = reports[1]
    lines = [
        "# QLoRA loading under accelerate's FSDP with cpu_ram_efficient_loading (bench/measure_qlora_loading.py)",
        "",
        f"{versions}; 2 CPU ranks over gloo, ACCELERATE_USE_FSDP=true, FSDP_CPU_RAM_EFFICIENT_LOADING=true "
        f"(transformers' is_fsdp_enabled(): {reports[0]['fsdp_enabled']}); an 8-layer random Llama (hidden 1024) "
        "saved as bf16 safetensors, loaded by from_pretrained as bf16 and as NF4 with bnb_4bit_quant_storage=bf16.",
        "",
        *rows,
        "",
        f"Quantised Linear4bit layers held on a device after loading: rank 0 {reports[0]['nf4_quantised_layers']}, "
        f"rank 1 {rank1['nf4_quantised_layers']}.",
        "",
        f"Rank 1 (not local rank 0) holds {rank1['nf4']['device'] / max(reports[0]['nf4']['device'], 1):.0%} of "
        f"rank 0's NF4 bytes on its device after from_pretrained, and its private memory grew by "
        f"{rank1['nf4']['private_growth'] / max(rank1['nf4']['device'], 1):.0%} of them; for the bf16 load the "
        f"figures are {rank1['bf16']['device'] / max(reports[0]['bf16']['device'], 1):.0%} and "
        f"{rank1['bf16']['private_growth'] / max(rank1['bf16']['device'], 1):.0%} (the bf16 weights stay memory-mapped "
        "from the file, shared by the ranks; the growth includes what the first load imports and allocates, some "
        "tens of MB). On GPUs bitsandbytes' "
        "quantiser sets the device to the rank's GPU (device_map {\"\": current GPU}): the whole quantised model "
        "on every GPU before FSDP shards it is the plan's loading peak for sharded QLoRA (Rung.load_bytes).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
