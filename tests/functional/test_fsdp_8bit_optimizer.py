"""The evidence for keeping --optimizer adamw-8bit off the FSDP rungs (plan._steppable_by): bitsandbytes' 8-bit
AdamW on FSDP2-sharded parameters fails at its first step. Two real CPU ranks over gloo, torch's fully_shard and
bitsandbytes' own AdamW8bit. If a bitsandbytes release learns DTensor, this test fails: then the plan may offer
FSDP with 8-bit AdamW again."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo")
    import bitsandbytes as bnb
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))   # > 4096 elements: 8-bit
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)
    model(torch.randn(4, 256)).pow(2).mean().backward()
    try:
        opt.step()
        print("STEP_OK", flush=True)
    except Exception as e:
        print("STEP_FAILED", type(e).__name__, str(e).replace(chr(10), " ")[:300], flush=True)
    dist.destroy_process_group()
""")


def test_bitsandbytes_8bit_adamw_cannot_step_fsdp2_parameters(tmp_path):
    pytest.importorskip("bitsandbytes")
    script = tmp_path / "fsdp_8bit.py"
    script.write_text(SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(port), str(script)],
                          capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout + proc.stderr
    assert out.count("STEP_FAILED") == 2 and "STEP_OK" not in out, out[-3000:]
    assert "DTensor" in out, out[-3000:]
