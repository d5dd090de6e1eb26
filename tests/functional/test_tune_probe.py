"""The tune probe (launch/_probe.py) sees the optimizer steps of every engine, on 2 real CPU ranks over gloo.

Each case starts 2 ranks with torchrun through launch/_worker.py (as every wizard launch does) with WIZARD_PROBE
set, running a small own training loop: torch DDP, DeepSpeed ZeRO-1 and ZeRO-3 with the optimizer offloaded
(DeepSpeedCPUAdam, JIT-built on first use), FSDP2 and a peft LoRA model under DDP. (ZeRO-2 and ZeRO-3 under
accelerate and the HF Trainer are measured by test_tune.py.) The probe must record warm-up + measured steps on
both ranks, each with at least one optimizer step and the tokens of the step, then end both ranks before the
script's own end ("SCRIPT-END" never printed) with exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.launch_support import REPO, env

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import os, sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    MODE = sys.argv[1]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    ids = torch.tensor([[(i + j) % 128 for j in range(32)] for i in range(4)])

    def groups(model):
        decay = [p for n, p in model.named_parameters() if p.requires_grad and "norm" not in n]
        rest = [p for n, p in model.named_parameters() if p.requires_grad and "norm" in n]
        return [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]

    if MODE.startswith("zero"):
        import deepspeed
        dist.init_process_group("gloo")
        stage = 3 if MODE.startswith("zero3") else 1
        zero = {"stage": stage}
        if MODE == "zero3-offload":
            zero["offload_optimizer"] = {"device": "cpu"}
        model = LlamaForCausalLM(cfg)
        config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "zero_optimization": zero}
        if MODE == "zero3-offload":       # DeepSpeed builds DeepSpeedCPUAdam for the offloaded states
            config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
            engine, *_ = deepspeed.initialize(model=model, model_parameters=groups(model), config=config)
        else:                             # the user's own torch optimizer, wrapped by ZeRO-1 (no JIT build)
            config["zero_allow_untested_optimizer"] = True
            engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(groups(model), lr=1e-3),
                                              config=config)
        for step in range(20):
            for micro in range(2):
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
    else:
        dist.init_process_group("gloo")
        model = LlamaForCausalLM(cfg)
        if MODE == "lora":
            from peft import LoraConfig, get_peft_model
            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        if MODE == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            wrapped = model
        else:
            wrapped = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(groups(model), lr=1e-3)
        for step in range(20):
            loss = wrapped(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    print("SCRIPT-END", flush=True)
''')

CASES = {
    "ddp": ("DistributedDataParallel", "AdamW", 1),
    "zero1": ("DeepSpeedEngine", "AdamW", 2),
    "zero3-offload": ("DeepSpeedEngine", "DeepSpeedCPUAdam", 2),
    "fsdp": ("FSDPLlamaForCausalLM", "AdamW", 1),     # FSDP2 swaps the class of the module it shards
    "lora": ("DistributedDataParallel", "AdamW", 1),
}


@pytest.mark.parametrize("mode", list(CASES))
def test_probe_sees_the_optimizer_steps(tmp_path, mode):
    script = tmp_path / "target.py"
    script.write_text(SCRIPT)
    probe_dir = tmp_path / "probe"
    e = env()
    e["WIZARD_PROBE"] = json.dumps({"dir": str(probe_dir), "warmup": 1, "measure": 2})
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(REPO / "launch" / "_worker.py"), str(script), mode],
                       cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "SCRIPT-END" not in r.stdout           # ended by the probe, before the script's own end
    root, optimizer, micro_batches = CASES[mode]
    for rank in (0, 1):
        lines = [json.loads(x) for x in (probe_dir / f"rank-{rank}.jsonl").read_text().splitlines()]
        steps = [x for x in lines if "step" in x]
        assert [s["step"] for s in steps] == [1, 2, 3], lines
        assert [s["warmup"] for s in steps] == [True, False, False]
        assert lines[-1].get("done") is True
        for s in steps:
            assert s["optimizer_steps"] >= 1 and s["seconds"] > 0 and s["rss_peak_bytes"] > 50 * 2**20, s
            assert s["micro_batches"] == micro_batches and s["root"] == root, s
            if optimizer:
                assert optimizer in s["optimizers"], s
        assert all(s["tokens"] == 4 * 32 * micro_batches for s in steps[1:]), steps
