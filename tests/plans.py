"""Hand-made one-rung plans and a Llama-2-7B shape, for tests of what is built from a plan."""

from __future__ import annotations

from wizard.planning.plan import Plan, Rung, Topology
from wizard.sizing.model import ModelShape

LLAMA2_7B = ModelShape(params=6_738_415_616, largest_layer_params=131_072_000, hidden_size=4096, layers=32,
                       heads=32, kv_heads=32, vocab_size=32000, intermediate_size=11008,
                       layer_class="LlamaDecoderLayer")


def make_plan(backend: str, world: int = 4, machines: int = 1, stage: int | None = None, oo: str = "none",
              op: str = "none", cpu: bool = False, precision: str = "bf16", reshard: bool | None = None,
              gc: bool = False) -> Plan:
    """A plan whose only rung, chosen, is `backend` on `world` processes over `machines` (80 GB GPUs)."""
    rung = Rung(key=backend, name=backend, backend=backend, zero_stage=stage, offload_optimizer=oo,
                offload_param=op, fsdp_reshard=reshard, gradient_checkpointing=gc, fits=True)
    return Plan(rungs=[rung], choice=rung, gpu_capacity_bytes=80 << 30, usable_bytes=72 << 30,
                precision=precision, topology=Topology(machines, max(1, world // machines), cpu))
